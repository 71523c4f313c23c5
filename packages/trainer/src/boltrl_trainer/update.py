"""The torch training backend: a batch of transitions with advantages → new weights.

``TorchTrainingBackend`` implements ``boltrl_trainer.seams.TrainingBackend`` on an
in-process model (CPU or one GPU), the same object its ``TransformersBackend`` serves.
Everything before it (rollouts, credit assignment, advantages) is shared by all backends.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from boltrl.errors import InvalidInput
from boltrl.records import Transition
from boltrl_trainer.algorithms import AlgorithmConfig, policy_loss
from boltrl_trainer.batching import index_rollouts, pack_microbatches, token_logprobs
from boltrl_trainer.config import OptimConfig
from boltrl_trainer.seams import TrainBatch

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

__all__ = ["TorchTrainingBackend", "load_trainable"]


class TorchTrainingBackend:
    """Updates an in-process model with AdamW, micro-batched by token budget.

    The model object is shared with the ``TransformersBackend`` that serves it; the
    caller runs ``update`` and ``load`` inside ``seams.weight_swap``. Not thread-safe.
    """

    def __init__(
        self,
        model: Any,
        algo: AlgorithmConfig,
        optim: OptimConfig,
        *,
        pad_id: int,
        version: int = 0,
    ) -> None:
        import torch

        self.model = model
        self.algo = algo
        self.optim_cfg = optim
        self.pad_id = pad_id
        self._version = version
        self.params = [p for p in model.parameters() if p.requires_grad]
        if not self.params:
            raise ValueError("the model has no trainable parameters")
        self.optimizer = torch.optim.AdamW(
            self.params, lr=optim.lr, betas=optim.betas, weight_decay=optim.weight_decay
        )
        self.device = next(model.parameters()).device
        self._use_ref = algo.kl_coef > 0
        log.info("torch backend: %d trainable params", sum(p.numel() for p in self.params))

    @property
    def policy_version(self) -> int:
        return self._version

    def _tensors(self, items: Sequence[Transition], advantages: Sequence[float]) -> dict[str, Any]:
        """Right-padded ``[B, S]`` inputs and ``[B, A]`` action-aligned tensors."""
        import torch

        seqs = [t.state + t.action for t in items]
        s_len = max(len(s) for s in seqs)
        a_len = max(len(t.action) for t in items)
        ids = torch.full((len(items), s_len), self.pad_id, dtype=torch.long)
        attn = torch.zeros((len(items), s_len), dtype=torch.long)
        pos = torch.zeros((len(items), a_len), dtype=torch.long)  # logit row per action token
        targets = torch.zeros((len(items), a_len), dtype=torch.long)
        old = torch.zeros((len(items), a_len), dtype=torch.float32)
        mask = torch.zeros((len(items), a_len), dtype=torch.float32)
        for i, t in enumerate(items):
            n, a = len(seqs[i]), len(t.action)
            ids[i, :n] = torch.tensor(seqs[i])
            attn[i, :n] = 1
            # the logits at position p predict token p+1: action token j sits at
            # len(state)+j and is predicted by position len(state)+j-1
            pos[i, :a] = torch.arange(len(t.state) - 1, len(t.state) - 1 + a)
            targets[i, :a] = torch.tensor(t.action)
            old[i, :a] = torch.tensor(t.action_logprobs)
            mask[i, :a] = torch.tensor(t.action_mask, dtype=torch.float32)
        dev = self.device
        return {
            "ids": ids.to(dev),
            "attn": attn.to(dev),
            "pos": pos.to(dev),
            "targets": targets.to(dev),
            "old": old.to(dev),
            "mask": mask.to(dev),
            "adv": torch.tensor(list(advantages), dtype=torch.float32, device=dev),
        }

    def _logprobs(self, x: dict[str, Any], temperature: float) -> torch.Tensor:
        # Run the decoder, then the LM head only where an action token is predicted: the
        # head (576 x 49152 on SmolLM2) over every prompt position would cost more than
        # the decoder itself. LoRA layers live inside the decoder, so this trains them.
        base = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model
        cfg = base.config
        if getattr(cfg, "final_logit_softcapping", None) or getattr(cfg, "logit_scale", None):
            # models that post-process logits in forward(): take the plain path
            logits = self.model(
                input_ids=x["ids"], attention_mask=x["attn"], use_cache=False
            ).logits
            v = logits.shape[-1]
            picked_logits = logits.gather(1, x["pos"][:, :, None].expand(-1, -1, v))
            return token_logprobs(picked_logits, x["targets"], temperature)
        decoder, head = base.get_decoder(), base.get_output_embeddings()
        hidden = decoder(input_ids=x["ids"], attention_mask=x["attn"], use_cache=False)
        h = hidden.last_hidden_state  # [B, S, H]
        picked = h.gather(1, x["pos"][:, :, None].expand(-1, -1, h.shape[-1]))  # [B, A, H]
        logits = head(picked)  # [B, A, V]
        return token_logprobs(logits, x["targets"], temperature)

    def update(self, batch: TrainBatch) -> dict[str, float]:
        """One optimizer step per epoch over the batch; returns its metrics."""
        import torch

        t0 = time.perf_counter()
        items = batch.transitions
        if not items:  # every group had equal rewards: nothing to learn from this batch
            return {"update/skipped": 1.0, "time/update_s": 0.0}
        rows, tokens = index_rollouts(items)
        rollout_tokens = torch.tensor(tokens, dtype=torch.float32, device=self.device)
        micro = pack_microbatches(items, self.optim_cfg.token_budget)
        self.model.train()
        sums: dict[str, float] = {}
        weight_total = 0.0
        grad_norm = 0.0
        for _ in range(self.optim_cfg.epochs):
            self.optimizer.zero_grad(set_to_none=True)
            for mb in micro:
                x = self._tensors([items[i] for i in mb], [batch.advantages[i] for i in mb])
                new = self._logprobs(x, batch.temperature)
                ref = None
                if self._use_ref:
                    with torch.no_grad(), self.model.disable_adapter():
                        ref = self._logprobs(x, batch.temperature)
                idx = torch.tensor([rows[i] for i in mb], dtype=torch.long, device=self.device)
                loss, m = policy_loss(
                    new,
                    x["old"],
                    x["adv"],
                    x["mask"],
                    idx,
                    self.algo,
                    ref,
                    rollout_tokens=rollout_tokens,
                )
                loss.backward()  # type: ignore[no-untyped-call]
                w = m.get("tokens", 0.0)
                weight_total += w
                sums["loss"] = sums.get("loss", 0.0) + float(loss.item())
                for k, v in m.items():
                    if k not in ("tokens", "ratio_max"):
                        sums[k] = sums.get(k, 0.0) + v * w
                sums["ratio_max"] = max(sums.get("ratio_max", 0.0), m.get("ratio_max", 0.0))
            grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, self.optim_cfg.grad_clip))
            self.optimizer.step()
        self.model.eval()
        self._version += 1
        metrics = {
            f"update/{k}": (v / max(weight_total, 1.0) if k not in ("loss", "ratio_max") else v)
            for k, v in sums.items()
        }
        metrics["update/loss"] = sums.get("loss", 0.0) / self.optim_cfg.epochs
        metrics["update/grad_norm"] = grad_norm
        metrics["update/microbatches"] = float(len(micro))
        metrics["update/tokens"] = weight_total / self.optim_cfg.epochs
        metrics["time/update_s"] = time.perf_counter() - t0
        return metrics

    # -- checkpoints ----------------------------------------------------------------

    def save(self, path: Path) -> None:
        """Trainable weights (safetensors) and optimizer state into ``path``."""
        save_trainable(self.model, self.optimizer, path)

    def load(self, path: Path, *, policy_version: int) -> None:
        """Restore ``save``'s weights and optimizer state; report ``policy_version``."""
        import torch

        load_trainable(self.model, path)
        opt = torch.load(path / "optimizer.pt", map_location=self.device, weights_only=True)
        self.optimizer.load_state_dict(opt)
        self._version = int(policy_version)

    def close(self) -> None:
        """Nothing to release: the model belongs to its server too."""


def save_trainable(model: Any, optimizer: Any, path: Path) -> None:
    """The checkpoint format RL and the warm start share: the trainable weights
    (``trainable.safetensors``) and the optimizer state (``optimizer.pt``) in ``path``."""
    import torch
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    trainable = {
        n: p.detach().cpu().contiguous() for n, p in model.named_parameters() if p.requires_grad
    }
    save_file(trainable, str(path / "trainable.safetensors"))
    torch.save(optimizer.state_dict(), path / "optimizer.pt")


def load_trainable(model: Any, path: Path) -> None:
    """Copy a checkpoint's trainable weights (``trainable.safetensors``) into ``model``."""
    import torch
    from safetensors.torch import load_file

    file = path / "trainable.safetensors"
    if not file.is_file():
        raise InvalidInput(
            f"checkpoint: {path} holds no {file.name} (a checkpoint of the torch backend)"
        )
    state = load_file(str(file))
    named = dict(model.named_parameters())
    unknown = [k for k in state if k not in named]
    if unknown:
        raise ValueError(f"checkpoint {path} does not fit this model: {unknown[:3]}")
    with torch.no_grad():
        for k, v in state.items():
            named[k].copy_(v.to(named[k].device))
