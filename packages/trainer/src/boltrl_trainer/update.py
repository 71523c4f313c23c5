"""The torch training backend: a batch of transitions with advantages → new weights.

``TorchTrainingBackend`` implements ``boltrl_trainer.seams.TrainingBackend`` on an
in-process model (CPU or one GPU). By default it trains the very object its
``TransformersBackend`` serves, in place, inside ``seams.weight_swap`` (generation
paused for the whole update): the synchronous loop, no copy. ``use_separate_copy()``
switches it to train a copy of the trainable weights while generation goes on from the
served ones (``seams.CandidateTrainer``): ``promote()`` copies them into the served model
under ``paused()`` (``seams.promote_swap``), ``reset()`` throws a candidate away. That is
what async training and online learning use. The copy shares every frozen weight with
the served model (read-only on both sides), so with LoRA it costs the adapters (a few MB
on SmolLM2) and with a full fine-tune one more copy of the model's weights (540 MB for
SmolLM2-135M in float32), on top of AdamW's two moments that either mode holds.

Samples of older policy versions (``Transition.policy_version`` below the backend's
version) are trained with decoupled PPO (``boltrl_trainer.offpolicy``): the proximal
logprobs are those of the weights at the start of the update, taken for micro-batches
that hold a stale sample, and only its stale rows use them; fresh rows use the recorded
behaviour logprobs, so an all-fresh batch costs and computes exactly what it always did.
They cost no extra forward pass: the first epoch's forward runs exactly those weights
(the optimizer steps once per epoch), so its detached logprobs are reused; only a model
with active dropout gets a separate no-grad pass in eval mode (``_proximal``).
Rows with equal states (a GRPO group's samples of one prompt) compute that state once
per micro-batch, and the prefix a micro-batch's states share (an agent's system prompt
and tool schemas) once before them, gradients included (``_shared_prompt``; 2.2x faster
on the demo's update); a batch where that computes no fewer positions takes the plain
padded forward.

Everything before the update (rollouts, credit assignment, advantages) is shared by all
backends.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from boltrl.errors import InvalidInput
from boltrl.records import Transition
from boltrl_trainer import _shared_prompt
from boltrl_trainer.algorithms import AlgorithmConfig, policy_loss
from boltrl_trainer.batching import (
    index_rollouts,
    pack_microbatches,
    pack_shared_microbatches,
    shared_cost,
    token_logprobs,
)
from boltrl_trainer.config import OptimConfig
from boltrl_trainer.malloc_tuning import update_phase
from boltrl_trainer.offpolicy import staleness_of
from boltrl_trainer.seams import TrainBatch

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

__all__ = ["TorchTrainingBackend", "load_trainable", "save_trainable", "training_copy"]

_IS_KEYS = ("is_weight_mean", "is_weight_std", "is_weight_max", "truncated_frac")
_REFERENCE = "reference.safetensors"


def training_copy(model: Any) -> Any:
    """A copy of ``model`` whose trainable parameters are its own and whose frozen ones
    are ``model``'s very tensors (shared, never written by training)."""
    memo: dict[int, Any] = {id(p): p for p in model.parameters() if not p.requires_grad}
    out = copy.deepcopy(model, memo)
    for module in out.modules():
        # an instance ``forward`` (the server's merged-LoRA sampling patches one per layer
        # while a loop runs) is a closure over the *served* layer: never let the copy
        # train through it
        module.__dict__.pop("forward", None)
    return out


class TorchTrainingBackend:
    """Updates an in-process model with AdamW, micro-batched by token budget.

    Shared mode (the default): ``model`` is the object the ``TransformersBackend``
    serves and the caller runs ``update`` and ``load`` inside ``seams.weight_swap``.
    After ``use_separate_copy()`` it is a ``seams.CandidateTrainer`` (module docstring).
    Not thread-safe: one caller.
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
        self.served = model
        """The model the paired server serves (``model`` itself in shared mode)."""
        self.algo = algo
        self.optim_cfg = optim
        self.pad_id = pad_id
        self._version = version
        self._served_version = version
        self._resettable = False
        self._snapshot: dict[str, Any] | None = None
        self.params = [p for p in model.parameters() if p.requires_grad]
        if not self.params:
            raise ValueError("the model has no trainable parameters")
        self.optimizer = torch.optim.AdamW(
            self.params, lr=optim.lr, betas=optim.betas, weight_decay=optim.weight_decay
        )
        self.device = next(model.parameters()).device
        self._use_ref = algo.kl_coef > 0
        self._ref: list[torch.Tensor] | None = None
        """The KL penalty's reference: the trainable weights RL started from (taken at the
        first update, so after a warm start or ``init_from``; kept in checkpoints)."""
        self._share_states = _shared_prompt.usable(model)
        """Whether rows with equal states may share one computation of it (``update``)."""
        self.min_shared = 16
        """Fewest positions a micro-batch's states must share for the shared forward to
        compute them once (a shorter prefix is not worth a pass of its own)."""
        log.info("torch backend: %d trainable params", sum(p.numel() for p in self.params))

    @property
    def policy_version(self) -> int:
        """Updates applied to the weights this backend trains (the candidate's version
        in separate mode)."""
        return self._version

    # -- a separate training copy (async training, online learning) ------------------

    @property
    def separate(self) -> bool:
        """True after ``use_separate_copy()``: updates leave the served weights alone."""
        return self.model is not self.served

    @property
    def served_version(self) -> int:
        """The version of the weights the server serves (last ``promote``/``load``)."""
        return self._served_version if self.separate else self._version

    def use_separate_copy(self, *, resettable: bool = False) -> None:
        """From now on train a copy of the served model's trainable weights (its current
        values, and the optimizer state so far); ``promote`` publishes them.

        Call it when the served weights are final for the start (after resume, ``init_from``
        and a warm start). ``resettable`` keeps a copy of the optimizer state at every
        promotion so ``reset`` can restore it (AdamW's two moments again: small for LoRA).
        Idempotent for the copy; ``resettable`` can only be turned on.
        """
        import torch

        self._resettable = self._resettable or resettable
        if not self.separate:
            state = self.optimizer.state_dict()
            self.model = training_copy(self.served)
            self.model.train(False)
            self.params = [p for p in self.model.parameters() if p.requires_grad]
            cfg = self.optim_cfg
            self.optimizer = torch.optim.AdamW(
                self.params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay
            )
            self.optimizer.load_state_dict(state)
            self._served_version = self._version
        if self._resettable and self._snapshot is None:
            self._snapshot = copy.deepcopy(self.optimizer.state_dict())

    def promote(self) -> int:
        """Serve the trained weights: copy them into the served model and return their
        version (which the caller then serves: ``seams.promote_swap`` runs both inside the
        server's ``paused()``, as it must: the served weights change). Shared mode: the
        weights are served already; returns the version."""
        if self.separate:
            _copy_trainable(self.model, self.served)
            self._served_version = self._version
            if self._resettable:
                self._snapshot = copy.deepcopy(self.optimizer.state_dict())
        return self._version

    def reset(self) -> None:
        """Discard the candidate: the trained weights, the version and the optimizer state
        go back to those of the last promotion (the served weights). Needs
        ``use_separate_copy(resettable=True)``; the server is not touched (no pause)."""
        if not (self.separate and self._resettable and self._snapshot is not None):
            raise RuntimeError("reset: call use_separate_copy(resettable=True) first")
        _copy_trainable(self.served, self.model)
        self.optimizer.load_state_dict(copy.deepcopy(self._snapshot))
        self._version = self._served_version

    def _tensors(
        self, items: Sequence[Transition], advantages: Sequence[float], *, shared: bool = False
    ) -> dict[str, Any]:
        """``[B, A]`` action-aligned tensors and the inputs of the forward pass: right-padded
        ``[B, S]`` ids, or with ``shared`` the two-pass inputs of ``_shared_prompt`` (each
        distinct state once) under ``"shared"``."""
        import torch

        a_len = max(len(t.action) for t in items)
        targets = torch.zeros((len(items), a_len), dtype=torch.long)
        old = torch.zeros((len(items), a_len), dtype=torch.float32)
        mask = torch.zeros((len(items), a_len), dtype=torch.float32)
        for i, t in enumerate(items):
            a = len(t.action)
            targets[i, :a] = torch.tensor(t.action)
            old[i, :a] = torch.tensor(t.action_logprobs)
            mask[i, :a] = torch.tensor(t.action_mask, dtype=torch.float32)
        dev = self.device
        out: dict[str, Any] = {
            "targets": targets.to(dev),
            "old": old.to(dev),
            "mask": mask.to(dev),
            "adv": torch.tensor(list(advantages), dtype=torch.float32, device=dev),
        }
        if shared:
            out["shared"] = _shared_prompt.shared_inputs(items, self.pad_id, dev, self.min_shared)
            return out
        seqs = [t.state + t.action for t in items]
        s_len = max(len(s) for s in seqs)
        ids = torch.full((len(items), s_len), self.pad_id, dtype=torch.long)
        attn = torch.zeros((len(items), s_len), dtype=torch.long)
        pos = torch.zeros((len(items), a_len), dtype=torch.long)  # logit row per action token
        for i, t in enumerate(items):
            n, a = len(seqs[i]), len(t.action)
            ids[i, :n] = torch.tensor(seqs[i])
            attn[i, :n] = 1
            # the logits at position p predict token p+1: action token j sits at
            # len(state)+j and is predicted by position len(state)+j-1
            pos[i, :a] = torch.arange(len(t.state) - 1, len(t.state) - 1 + a)
        out.update(ids=ids.to(dev), attn=attn.to(dev), pos=pos.to(dev))
        return out

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
        head = base.get_output_embeddings()
        if "shared" in x:
            return token_logprobs(
                head(_shared_prompt.action_hidden(self.model, x["shared"])),
                x["targets"],
                temperature,
            )
        decoder = base.get_decoder()
        hidden = decoder(input_ids=x["ids"], attention_mask=x["attn"], use_cache=False)
        h = hidden.last_hidden_state  # [B, S, H]
        picked = h.gather(1, x["pos"][:, :, None].expand(-1, -1, h.shape[-1]))  # [B, A, H]
        logits = head(picked)  # [B, A, V]
        return token_logprobs(logits, x["targets"], temperature)

    def update(self, batch: TrainBatch) -> dict[str, float]:
        """One optimizer step per epoch over the batch; returns its metrics."""
        with update_phase():  # large freed blocks go back to the OS meanwhile
            return self._update(batch)

    def _update(self, batch: TrainBatch) -> dict[str, float]:
        import torch

        t0 = time.perf_counter()
        items = batch.transitions
        if not items:  # every group had equal rewards: nothing to learn from this batch
            return {"update/skipped": 1.0, "time/update_s": 0.0}
        if self._use_ref and self._ref is None:  # the weights RL starts from
            self._ref = [p.detach().clone() for p in self.params]
        rows, tokens = index_rollouts(items)
        rollout_tokens = torch.tensor(tokens, dtype=torch.float32, device=self.device)
        micro, shared = self._pack(items)
        stale = [staleness_of(t, self._version) > 0 for t in items]
        prox_cache: dict[int, torch.Tensor] = {}  # computed in epoch 0: the proximal weights
        # The reference's logprobs of a micro-batch are the same in every epoch (its weights
        # and the batch do not change): computed once, in epoch 0, they save a forward a
        # micro-batch in each later epoch (with dropout, one draw stands for all epochs)
        ref_cache: dict[int, torch.Tensor] = {}
        is_sums = dict.fromkeys(("n", "w", "w2", "max", "trunc"), 0.0)
        t_prox, t_ref, passes = 0.0, 0.0, 0
        noisy = any(stale) and _dropout_active(self.model)
        self.model.train()
        sums: dict[str, float] = {}
        weight_total = 0.0
        grad_norm = 0.0
        for epoch in range(self.optim_cfg.epochs):
            self.optimizer.zero_grad(set_to_none=True)
            for j, mb in enumerate(micro):
                x = self._tensors(
                    [items[i] for i in mb], [batch.advantages[i] for i in mb], shared=shared
                )
                ref = None
                if self._use_ref:
                    if j not in ref_cache:  # before the forward with grad: swaps weights
                        t1 = time.perf_counter()
                        with torch.no_grad(), self._reference_weights():
                            ref_cache[j] = self._logprobs(x, batch.temperature)
                        t_ref += time.perf_counter() - t1
                    ref = ref_cache[j]
                new = self._logprobs(x, batch.temperature)
                prox = None
                if any(stale[i] for i in mb):
                    if j not in prox_cache:  # epoch 0: the weights are the proximal ones
                        t1 = time.perf_counter()
                        first = None if noisy else new
                        passes += first is None
                        prox_cache[j] = self._proximal(x, [stale[i] for i in mb], batch, first)
                        t_prox += time.perf_counter() - t1
                    prox = prox_cache[j]
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
                    prox_logprobs=prox,
                )
                loss.backward()  # type: ignore[no-untyped-call]
                w = m.get("tokens", 0.0)
                if prox is not None:
                    is_m = {k: m.pop(k) for k in _IS_KEYS}
                    if epoch == 0:  # the weights do not depend on theta: count them once
                        _add_is(is_sums, is_m, w)
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
        metrics["update/shared_states"] = float(shared)
        metrics["update/tokens"] = weight_total / self.optim_cfg.epochs
        metrics["offpolicy/stale_frac"] = sum(stale) / len(stale)
        if is_sums["n"] > 0:
            metrics.update(_is_metrics(is_sums))
            metrics["time/proximal_s"] = t_prox
            metrics["update/proximal_passes"] = float(passes)  # separate forwards (dropout)
        if self._use_ref:
            metrics["time/reference_s"] = t_ref  # the KL reference's forwards, in update_s
        metrics["time/update_s"] = time.perf_counter() - t0
        return metrics

    def _pack(self, items: Sequence[Transition]) -> tuple[list[list[int]], bool]:
        """Micro-batches, and whether they take the shared forward: rows with equal states
        (a GRPO group's samples of one prompt) computing that state once, and the prefix
        their states share (an agent's system prompt and tools) once; taken when it
        computes fewer positions than the plain padded forward."""
        budget = self.optim_cfg.token_budget
        plain = pack_microbatches(items, budget)
        if not self._share_states:
            return plain, False
        shared = pack_shared_microbatches(items, budget, self.min_shared)
        plain_cost = sum(
            len(b) * max(len(items[i].state) + len(items[i].action) for i in b) for b in plain
        )
        if sum(shared_cost(items, b, self.min_shared) for b in shared) < plain_cost:
            return shared, True
        return plain, False

    @contextlib.contextmanager
    def _reference_weights(self) -> Iterator[None]:
        """The KL reference's weights in the trainable parameters inside the block (the
        model's frozen weights are shared, so this is the whole reference policy; with a
        full fine-tune it copies the model twice a micro-batch)."""
        import torch

        assert self._ref is not None
        with torch.no_grad():
            own = [p.detach().clone() for p in self.params]
            for p, r in zip(self.params, self._ref, strict=True):
                p.copy_(r)
        try:
            yield
        finally:
            with torch.no_grad():
                for p, o in zip(self.params, own, strict=True):
                    p.copy_(o)

    def _proximal(
        self,
        x: dict[str, Any],
        stale: list[bool],
        batch: TrainBatch,
        first_pass: torch.Tensor | None,
    ) -> torch.Tensor:
        """``[B, A]`` proximal logprobs: the weights before this update for stale rows,
        the recorded behaviour ones for fresh rows.

        ``first_pass`` is epoch 0's own forward pass: the optimizer steps once per epoch,
        after every micro-batch, so that pass runs exactly the weights at the start of the
        update and its detached logprobs *are* the proximal ones, at no extra cost. None
        (a model whose training forward is noisy: active dropout) runs a separate no-grad
        forward in eval mode."""
        import torch

        if first_pass is not None:
            recomputed = first_pass.detach()
        else:
            was_training = self.model.training
            self.model.train(False)  # the policy as it samples, without dropout noise
            try:
                with torch.no_grad():
                    recomputed = self._logprobs(x, batch.temperature)
            finally:
                self.model.train(was_training)
        rows = torch.tensor(stale, dtype=torch.bool, device=self.device)[:, None]
        return torch.where(rows, recomputed, x["old"])

    # -- checkpoints ----------------------------------------------------------------

    def save(self, path: Path) -> None:
        """Trainable weights (safetensors) and optimizer state into ``path``, and the KL
        reference's weights (``reference.safetensors``) once it is set."""
        from safetensors.torch import save_file

        save_trainable(self.model, self.optimizer, path)
        if self._ref is not None:
            names = [n for n, p in self.model.named_parameters() if p.requires_grad]
            ref = {n: r.cpu().contiguous() for n, r in zip(names, self._ref, strict=True)}
            save_file(ref, str(path / _REFERENCE))

    def load(self, path: Path, *, policy_version: int) -> None:
        """Restore ``save``'s weights and optimizer state; report ``policy_version``. A
        checkpoint with a KL reference restores it too (a resumed run keeps its anchor);
        without one, the reference is taken at the next update, from these weights."""
        import torch
        from safetensors.torch import load_file

        load_trainable(self.model, path)
        opt = torch.load(path / "optimizer.pt", map_location=self.device, weights_only=True)
        self.optimizer.load_state_dict(opt)
        self._version = int(policy_version)
        self._ref = None
        if self._use_ref and (path / _REFERENCE).is_file():
            state = load_file(str(path / _REFERENCE))
            names = [n for n, p in self.model.named_parameters() if p.requires_grad]
            self._ref = [state[n].to(self.device) for n in names]
        if self.separate:  # the caller holds the pause (weight_swap): serve them too
            _copy_trainable(self.model, self.served)
            self._served_version = self._version
            if self._resettable:
                self._snapshot = copy.deepcopy(self.optimizer.state_dict())

    def close(self) -> None:
        """Nothing to release: the model belongs to its server too."""


def _dropout_active(model: Any) -> bool:
    """Whether ``model``'s training forward is stochastic: a dropout module with p > 0
    (LoRA's ``lora_dropout`` among them) or a ``*dropout`` config value above 0."""
    import torch

    if any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules()):
        return True
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    cfg = getattr(base, "config", None)
    values = vars(cfg).items() if cfg is not None else ()
    return any(k.endswith("dropout") and isinstance(v, float) and v > 0 for k, v in values)


def _copy_trainable(src: Any, dst: Any) -> None:
    """``dst``'s trainable parameters := ``src``'s (same architecture and names)."""
    import torch

    named = dict(dst.named_parameters())
    with torch.no_grad():
        for name, p in src.named_parameters():
            if p.requires_grad:
                named[name].copy_(p)


def _add_is(sums: dict[str, float], m: dict[str, float], n: float) -> None:
    """Accumulate one micro-batch's weight statistics over its ``n`` trained tokens."""
    mean, std = m["is_weight_mean"], m["is_weight_std"]
    sums["n"] += n
    sums["w"] += mean * n
    sums["w2"] += (std * std + mean * mean) * n
    sums["max"] = max(sums["max"], m["is_weight_max"])
    sums["trunc"] += m["truncated_frac"] * n


def _is_metrics(sums: dict[str, float]) -> dict[str, float]:
    n = sums["n"]
    mean = sums["w"] / n
    return {
        "offpolicy/is_weight_mean": mean,
        "offpolicy/is_weight_std": max(sums["w2"] / n - mean * mean, 0.0) ** 0.5,
        "offpolicy/is_weight_max": sums["max"],
        "offpolicy/truncated_frac": sums["trunc"] / n,
    }


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
