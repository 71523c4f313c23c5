"""Transitions → verl's batch layout, and verl's update metrics → boltrl's.

verl's PPO workers consume a ``DataProto`` whose tensors follow one contract (the one
its agent loop produces, ``verl/experimental/agent_loop/agent_loop.py``):

- ``prompts`` ``[B, P]``: prompt ids, **left**-padded with ``pad_id``;
- ``responses`` ``[B, R]``: response ids, **right**-padded;
- ``input_ids`` ``[B, P + R]`` = ``prompts ++ responses``;
- ``attention_mask`` ``[B, P + R]`` (int64): 1 on real tokens, 0 on padding;
- ``position_ids`` ``[B, P + R]``: ``clip(cumsum(attention_mask) - 1, 0)``;
- ``response_mask`` ``[B, R]`` (int64): 1 on sampled tokens, 0 on observation tokens
  (prefix-merged tool output) and padding — boltrl's ``action_mask``;
- ``rollout_log_probs`` ``[B, R]`` (float32): the sampler's logprobs, 0 on padding;
- ``token_level_scores`` / ``token_level_rewards`` ``[B, R]``: the credited reward on the
  last response token, 0 elsewhere;
- ``advantages`` / ``returns`` ``[B, R]`` (only when boltrl computed the advantages):
  the transition's advantage, times ``advantage_scale``, on every trained token;
- ``advantage_scale`` ``[B]``: the loss-normalization scale of each row (below; 0 for
  padding rows), applied to verl-computed advantages by the backend;
- non-tensor ``uid`` (object array): the advantage group (GRPO groups by it).

Rollout-normalized loss. boltrl's ``loss_normalization: rollout`` averages each rollout's
tokens, then rollouts. verl's ``token-mean`` divides the summed token losses by the
batch's trained tokens ``N``. The clipped surrogate is positively homogeneous in the
advantage, so giving rollout ``r`` (``n_r`` trained tokens, ``K`` rollouts) advantages
scaled by ``N / (K * n_r)`` makes verl's token-mean loss equal boltrl's rollout-mean
loss exactly (with one mini-batch per epoch, as the verl backend configures).

Divisibility. verl splits a batch evenly over data-parallel ranks and each rank's share
into equal micro-batches, so the row count must be a multiple of ``multiple``
(``dp_size * micro_batch_size_per_gpu``). Nothing is dropped: the batch is topped up
with copies of real rows whose ``response_mask``, advantages and rewards are 0 (they
add no loss, no gradient and no tokens to the normalizer) and counted in ``pad_rows``.

Everything here is plain torch/numpy; ``to_dataproto`` alone needs verl.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from boltrl.errors import InvalidInput
from boltrl.records import Transition

if TYPE_CHECKING:
    import numpy as np
    import torch

__all__ = [
    "PAD_UID_PREFIX",
    "VerlBatch",
    "metrics_from_verl",
    "rollout_weights",
    "to_dataproto",
    "token_ids",
    "transitions_to_verl",
]

PAD_UID_PREFIX = "__boltrl_pad__"
"""``uid`` prefix of divisibility padding rows (each is its own group)."""

Normalization = Literal["rollout", "token"]


@dataclass
class VerlBatch:
    """A batch in verl's layout (see module doc), before it becomes a ``DataProto``."""

    tensors: dict[str, torch.Tensor]
    non_tensors: dict[str, np.ndarray]
    meta_info: dict[str, Any] = field(default_factory=dict)
    real_rows: int = 0
    """Rows that hold a transition (the first ``real_rows`` rows)."""
    pad_rows: int = 0
    """Zero-weight rows appended for divisibility."""

    def __len__(self) -> int:
        return self.real_rows + self.pad_rows


def rollout_weights(
    transitions: Sequence[Transition], normalization: Normalization = "rollout"
) -> list[float]:
    """Per-transition advantage scale that turns verl's token-mean into ``normalization``.

    ``token``: all 1. ``rollout``: ``N / (K * n_r)`` with ``N`` the batch's trained tokens,
    ``K`` the rollouts that have any, ``n_r`` those of the transition's rollout.
    """
    if normalization == "token":
        return [1.0] * len(transitions)
    per_rollout: dict[str, int] = {}
    for t in transitions:
        per_rollout[t.rollout_id] = per_rollout.get(t.rollout_id, 0) + sum(t.action_mask)
    total = sum(per_rollout.values())
    rollouts = sum(1 for n in per_rollout.values() if n > 0)
    if total == 0:
        return [1.0] * len(transitions)
    return [total / (rollouts * max(per_rollout[t.rollout_id], 1)) for t in transitions]


def _check(transitions: Sequence[Transition], advantages: Sequence[float] | None) -> None:
    if not transitions:
        raise InvalidInput("transitions: the batch is empty; there is nothing to train on")
    if advantages is not None and len(advantages) != len(transitions):
        raise InvalidInput(
            f"advantages: {len(advantages)} values for {len(transitions)} transitions"
        )
    for i, t in enumerate(transitions):
        where = f"transitions[{i}] (rollout {t.rollout_id}, step {t.step})"
        if not t.state:
            raise InvalidInput(f"{where}: empty state; verl needs at least one prompt token")
        if not t.action:
            raise InvalidInput(f"{where}: empty action; there is no token to train on")
        if len(t.action_mask) != len(t.action) or len(t.action_logprobs) != len(t.action):
            raise InvalidInput(
                f"{where}: action ({len(t.action)}), action_mask ({len(t.action_mask)}) and "
                f"action_logprobs ({len(t.action_logprobs)}) must have the same length"
            )


def transitions_to_verl(
    transitions: Sequence[Transition],
    advantages: Sequence[float] | None = None,
    *,
    pad_id: int,
    multiple: int = 1,
    normalization: Normalization = "rollout",
    temperature: float = 1.0,
    prompt_width: int | None = None,
    response_width: int | None = None,
) -> VerlBatch:
    """Lay ``transitions`` out as verl expects (see module doc).

    ``advantages`` (one per transition, from boltrl's credit assignment) fill
    ``advantages``/``returns``, scaled for ``normalization``; None leaves them to verl's
    advantage estimator, which reads ``token_level_rewards`` and groups by ``uid``.
    ``multiple``: the row count is padded up to a multiple of it. ``prompt_width`` /
    ``response_width`` fix ``P`` / ``R`` (default: the longest in the batch); a transition
    longer than a fixed width is an error, never truncated.
    """
    import numpy as np
    import torch

    _check(transitions, advantages)
    if multiple < 1:
        raise InvalidInput(f"multiple: must be >= 1 (got {multiple})")
    longest_p = max(len(t.state) for t in transitions)
    longest_r = max(len(t.action) for t in transitions)
    p = prompt_width or longest_p
    r = response_width or longest_r
    if longest_p > p or longest_r > r:
        raise InvalidInput(
            f"transitions: longest prompt/response {longest_p}/{longest_r} tokens exceed the "
            f"fixed widths {p}/{r}; raise them (nothing is truncated)"
        )
    real = len(transitions)
    pad_rows = -real % multiple
    rows = real + pad_rows
    prompts = torch.full((rows, p), pad_id, dtype=torch.long)
    responses = torch.full((rows, r), pad_id, dtype=torch.long)
    prompt_attn = torch.zeros((rows, p), dtype=torch.long)
    response_attn = torch.zeros((rows, r), dtype=torch.long)
    response_mask = torch.zeros((rows, r), dtype=torch.long)
    logprobs = torch.zeros((rows, r), dtype=torch.float32)
    scores = torch.zeros((rows, r), dtype=torch.float32)
    for i in range(rows):
        t = transitions[i % real]  # padding rows copy real rows: same shapes, zero weight
        s, a = len(t.state), len(t.action)
        prompts[i, p - s :] = torch.tensor(t.state, dtype=torch.long)
        prompt_attn[i, p - s :] = 1
        responses[i, :a] = torch.tensor(t.action, dtype=torch.long)
        response_attn[i, :a] = 1
        logprobs[i, :a] = torch.tensor(t.action_logprobs, dtype=torch.float32)
        if i < real:
            response_mask[i, :a] = torch.tensor(t.action_mask, dtype=torch.long)
            scores[i, a - 1] = float(t.reward)
    attention_mask = torch.cat([prompt_attn, response_attn], dim=1)
    tensors: dict[str, torch.Tensor] = {
        "prompts": prompts,
        "responses": responses,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": torch.clip(torch.cumsum(attention_mask, dim=-1) - 1, min=0),
        "response_mask": response_mask,
        "rollout_log_probs": logprobs,
        "token_level_scores": scores,
        "token_level_rewards": scores.clone(),
    }
    scale = torch.zeros(rows, dtype=torch.float32)  # padding rows weigh 0
    scale[:real] = torch.tensor(rollout_weights(transitions, normalization), dtype=torch.float32)
    tensors["advantage_scale"] = scale
    if advantages is not None:
        per_row = torch.zeros(rows, dtype=torch.float32)
        per_row[:real] = torch.tensor(list(advantages), dtype=torch.float32)
        tensors["advantages"] = (per_row * scale)[:, None] * response_mask.to(torch.float32)
        tensors["returns"] = tensors["advantages"].clone()

    def column(values: list[Any]) -> np.ndarray:
        out = np.empty(rows, dtype=object)
        out[:] = values
        return out

    pads = [f"{PAD_UID_PREFIX}{k}" for k in range(pad_rows)]
    non_tensors = {
        "uid": column([t.group for t in transitions] + pads),
        "rollout_id": column([t.rollout_id for t in transitions] + pads),
        "boltrl_step": column([t.step for t in transitions] + [-1] * pad_rows),
        "boltrl_pad": np.array([False] * real + [True] * pad_rows, dtype=bool),
    }
    meta = {"temperature": float(temperature), "boltrl_pad_rows": pad_rows}
    return VerlBatch(tensors, non_tensors, meta, real_rows=real, pad_rows=pad_rows)


def token_ids(batch: VerlBatch | Mapping[str, torch.Tensor]) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, response ids) of every row, read back through the attention mask."""
    tensors = batch.tensors if isinstance(batch, VerlBatch) else batch
    p = tensors["prompts"].shape[1]
    attn = tensors["attention_mask"].bool()
    out = []
    for i in range(tensors["prompts"].shape[0]):
        prompt = tensors["prompts"][i][attn[i, :p]].tolist()
        response = tensors["responses"][i][attn[i, p:]].tolist()
        out.append((prompt, response))
    return out


def to_dataproto(batch: VerlBatch) -> Any:
    """The ``verl.DataProto`` of ``batch`` (needs verl installed)."""
    from verl import DataProto

    return DataProto.from_dict(
        tensors=batch.tensors, non_tensors=batch.non_tensors, meta_info=dict(batch.meta_info)
    )


# verl metric name -> boltrl's (the torch backend's names, so dashboards line up)
_RENAMES = {
    "actor/pg_loss": "update/loss",
    "actor/pg_clipfrac": "update/clip_frac",
    "actor/ppo_kl": "update/approx_kl",
    "actor/grad_norm": "update/grad_norm",
    "actor/entropy": "update/entropy",
    "actor/kl_loss": "update/kl_ref",
    "kl_loss": "update/kl_ref",
    "actor/lr": "update/lr",
}


def _mean(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, list | tuple) and value:
        numbers = [_mean(v) for v in value]
        kept = [v for v in numbers if v is not None]
        return sum(kept) / len(kept) if kept else None
    item = getattr(value, "item", None)  # 0-d tensors and numpy scalars
    if callable(item):
        try:
            return float(item())
        except (TypeError, ValueError):
            return None
    return None


def metrics_from_verl(metrics: Mapping[str, Any]) -> dict[str, float]:
    """verl's update metrics (scalars or per-micro-batch lists) as flat floats.

    Every metric is kept under ``verl/<name>``; the ones the torch backend also reports
    are copied to its names (``update/loss``, ``update/clip_frac``, ...). Values that are
    not numbers are left out.
    """
    out: dict[str, float] = {}
    for key, value in metrics.items():
        v = _mean(value)
        if v is None:
            continue
        out[f"verl/{key}"] = v
        if key in _RENAMES:
            out[_RENAMES[key]] = v
    return out
