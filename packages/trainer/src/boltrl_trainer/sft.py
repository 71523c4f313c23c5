"""Supervised fine-tuning on transitions: NLL on action tokens only.

``SFTBackend`` trains the very model object the policy server serves (LoRA adapters or
every weight, as loaded), micro-batched by token budget like the RL update, the rows that
share a prompt prefix packed together (``boltrl_trainer.batching.pack_prefix_microbatches``).
The loss of an optimizer step is the mean negative log-likelihood over the step's trained
tokens (``action_mask == 1``): prompt tokens and observation tokens inside a prefix-merged
action are context, never targets.
Checkpoints have the RL format (``trainable.safetensors`` + ``optimizer.pt``), so
``init_from`` and ``boltrl eval --checkpoint`` read them.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from boltrl.errors import InvalidInput
from boltrl.records import Transition
from boltrl_trainer.batching import (
    pack_microbatches,
    pack_prefix_microbatches,
    shared_prefix,
    token_logprobs,
)
from boltrl_trainer.malloc_tuning import update_phase
from boltrl_trainer.update import save_trainable

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

__all__ = ["SFTBackend"]

_MIN_SHARED = 16
"""Shorter shared prefixes are not worth a second decoder call."""


class SFTBackend:
    """AdamW on the NLL of action tokens. Not thread-safe; the caller keeps generation
    paused while it trains the served model (``backend.update_weights()``)."""

    def __init__(
        self,
        model: Any,
        *,
        lr: float,
        pad_id: int,
        token_budget: int = 4096,
        grad_clip: float = 1.0,
        weight_decay: float = 0.0,
        share_prefix: bool = True,
    ) -> None:
        import torch

        self.model = model
        self.pad_id = pad_id
        self.token_budget = token_budget
        self.grad_clip = grad_clip
        self.share_prefix = share_prefix
        """Run a prompt prefix that all rows of a micro-batch share once (see _logprobs)."""
        self.params = [p for p in model.parameters() if p.requires_grad]
        if not self.params:
            raise InvalidInput("model: has no trainable parameters")
        self.optimizer = torch.optim.AdamW(self.params, lr=lr, weight_decay=weight_decay)
        self.device = next(model.parameters()).device

    def _tensors(self, items: Sequence[Transition], skip: int = 0) -> dict[str, torch.Tensor]:
        """Right-padded ``[B, S]`` ids/attention (of each ``state + action`` without its
        first ``skip`` tokens) and ``[B, A]`` action-aligned tensors."""
        import torch

        seqs = [(t.state + t.action)[skip:] for t in items]
        s_len = max(len(s) for s in seqs)
        a_len = max(len(t.action) for t in items)
        ids = torch.full((len(items), s_len), self.pad_id, dtype=torch.long)
        attn = torch.zeros((len(items), s_len), dtype=torch.long)
        pos = torch.zeros((len(items), a_len), dtype=torch.long)
        targets = torch.zeros((len(items), a_len), dtype=torch.long)
        mask = torch.zeros((len(items), a_len), dtype=torch.float32)
        for i, t in enumerate(items):
            n, a, first = len(seqs[i]), len(t.action), len(t.state) - 1 - skip
            ids[i, :n] = torch.tensor(seqs[i])
            attn[i, :n] = 1
            # the logits at position p predict token p+1
            pos[i, :a] = torch.arange(first, first + a)
            targets[i, :a] = torch.tensor(t.action)
            mask[i, :a] = torch.tensor(t.action_mask, dtype=torch.float32)
        dev = self.device
        return {
            "ids": ids.to(dev),
            "attn": attn.to(dev),
            "pos": pos.to(dev),
            "targets": targets.to(dev),
            "mask": mask.to(dev),
        }

    @staticmethod
    def shared_prefix(items: Sequence[Transition]) -> int:
        """Length of the prompt prefix every row of ``items`` shares (0 for one row), kept
        short of each prompt's last token, which predicts the first action token."""
        return shared_prefix([t.state for t in items])

    def _pack(self, items: Sequence[Transition]) -> list[list[int]]:
        if self.share_prefix:
            return pack_prefix_microbatches(items, self.token_budget, _MIN_SHARED)
        return pack_microbatches(items, self.token_budget)

    def _logprobs(self, items: Sequence[Transition]) -> tuple[torch.Tensor, torch.Tensor]:
        """``[B, A]`` log-probs of the action tokens and their mask.

        Agents send one system prompt (and tool schemas) with every task, so the rows of a
        micro-batch often share a long prefix: it runs once, and the rows continue from
        its KV cache (the same loss and gradients, far less compute). The LM head runs
        only where an action token is predicted (over every prompt position it would cost
        more than the decoder on SmolLM2).
        """
        import torch

        base = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model
        cfg = base.config
        if getattr(cfg, "final_logit_softcapping", None) or getattr(cfg, "logit_scale", None):
            x = self._tensors(items)  # models that post-process logits in forward()
            logits = self.model(input_ids=x["ids"], attention_mask=x["attn"], use_cache=False)
            v = logits.logits.shape[-1]
            picked = logits.logits.gather(1, x["pos"][:, :, None].expand(-1, -1, v))
            return token_logprobs(picked, x["targets"]), x["mask"]
        decoder = base.get_decoder()
        skip = self.shared_prefix(items) if self.share_prefix else 0
        x = self._tensors(items, skip)
        if skip >= _MIN_SHARED:
            from transformers import DynamicCache

            # transformers renamed the argument (past_key_values -> cache)
            params = inspect.signature(decoder.forward).parameters
            key = "cache" if "cache" in params else "past_key_values"
            prefix = torch.tensor([items[0].state[:skip]], device=self.device)
            cache = DynamicCache()
            decoder(input_ids=prefix, use_cache=True, **{key: cache})
            cache.batch_repeat_interleave(len(items))  # [1, ...] -> [B, ...], differentiable
            attn = torch.cat([torch.ones_like(x["attn"][:, :1]).expand(-1, skip), x["attn"]], 1)
            positions = torch.arange(skip, skip + x["ids"].shape[1], device=self.device)
            hidden = decoder(
                input_ids=x["ids"],
                attention_mask=attn,
                position_ids=positions.expand(len(items), -1),
                use_cache=True,
                **{key: cache},
            )
        else:
            hidden = decoder(input_ids=x["ids"], attention_mask=x["attn"], use_cache=False)
        h = hidden.last_hidden_state  # [B, S, H]
        picked_h = h.gather(1, x["pos"][:, :, None].expand(-1, -1, h.shape[-1]))  # [B, A, H]
        logits = base.get_output_embeddings()(picked_h)
        return token_logprobs(logits, x["targets"]), x["mask"]

    def step(self, items: Sequence[Transition]) -> dict[str, float]:
        """One optimizer step on ``items``; returns ``sft/loss`` (mean NLL per trained
        token, before the step), ``sft/tokens``, ``sft/grad_norm``, ``sft/microbatches``
        and ``time/update_s``."""
        import torch

        if not items:
            raise InvalidInput("demonstrations: an SFT step needs at least one transition")
        t0 = time.perf_counter()
        total = float(sum(sum(t.action_mask) for t in items))
        if total == 0:
            raise InvalidInput("demonstrations: no trained tokens (every action_mask is 0)")
        micro = self._pack(items)
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        nll_sum = 0.0
        try:
            with update_phase():  # large freed blocks go back to the OS meanwhile
                for mb in micro:
                    logp, mask = self._logprobs([items[i] for i in mb])
                    nll = -(logp * mask).sum()
                    (nll / total).backward()  # type: ignore[no-untyped-call]
                    nll_sum += float(nll.detach())
                grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, self.grad_clip))
                self.optimizer.step()
        finally:
            self.model.eval()
        return {
            "sft/loss": nll_sum / total,
            "sft/tokens": total,
            "sft/grad_norm": grad_norm,
            "sft/microbatches": float(len(micro)),
            "time/update_s": time.perf_counter() - t0,
        }

    def loss(self, items: Sequence[Transition]) -> float:
        """Mean NLL per trained token of ``items`` under the current weights (no update)."""
        import torch

        total = float(sum(sum(t.action_mask) for t in items))
        nll_sum = 0.0
        with torch.no_grad():
            for mb in self._pack(items):
                logp, mask = self._logprobs([items[i] for i in mb])
                nll_sum += float(-(logp * mask).sum())
        return nll_sum / max(total, 1.0)

    def save(self, path: Path) -> None:
        """Trainable weights (safetensors) and optimizer state: the RL checkpoint format."""
        save_trainable(self.model, self.optimizer, path)
