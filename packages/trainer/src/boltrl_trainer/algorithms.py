"""Policy-gradient algorithms on boltrl transitions: GRPO, RLOO and REINFORCE.

Read top to bottom: the configs (one per algorithm), advantages from grouped rollout
returns, and the clipped policy loss with per-rollout normalization. What the training
loop needs to feed the loss (rollout indexing, micro-batches, log-probs from logits)
lives in ``boltrl_trainer.batching``.

Advantages. A rollout's *return* is its reward from the start under the credit mode
(``boltrl.credit``): the final reward for ``final`` credit, ``sum_k gamma^k r_k`` for
``discounted``; it equals the reward of the rollout's first transition. Rollouts of the
same task group share a baseline ``b`` (and, for GRPO, a scale ``s``) computed from
their returns, and every transition gets ``(G_t - b) / s`` where ``G_t`` is its own
credited reward. With ``final`` credit ``G_t`` is the return and this is exactly GRPO /
RLOO. With ``discounted`` credit the group baseline estimates the value of the task's
start state and is applied to each step's return-to-go: it does not depend on the
step's action, so (leave-one-out, as in RLOO) it adds no bias, only reduces variance.

- GRPO: ``b = mean(group)``, ``s = std(group) + eps`` (sample std; ``s = 1`` with
  ``scale_by_std=False``, as Dr. GRPO recommends).
- RLOO: ``b_i = mean(group without rollout i)``, ``s = 1``.
- REINFORCE: ``b`` = the batch mean, an exponential running mean of past batch means,
  or 0; groups play no part except for the optional zero-variance skip.

Groups whose returns are all equal carry no learning signal for GRPO / RLOO (their
advantages are exactly 0); they are skipped (``keep`` False) and counted, so they cost
no compute and do not dilute the per-rollout loss average.

Loss. PPO's clipped surrogate per action token with ``ratio = exp(logp_new - logp_old)``
where ``logp_old`` are the logprobs the gateway recorded at sampling time, plus an
optional ``kl_coef * KL(new || ref)`` with the k3 estimator. Token losses are masked by
``action_mask`` and averaged per rollout, then over rollouts, so a long episode counts
as much as a short one. For samples an older policy drew (async training), the loss is
decoupled PPO: the ratio is taken against the proximal policy (``prox_logprobs``) and
each token's surrogate is weighted by ``min(pi_prox / pi_behaviour, is_cap)``; without
``prox_logprobs`` (every sample fresh) it is exactly the loss above
(``boltrl_trainer.offpolicy`` says why).

Torch is imported inside the functions so that importing the configs stays cheap.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from boltrl.errors import InvalidInput
from boltrl.records import Transition

if TYPE_CHECKING:
    import torch

__all__ = [
    "ALGORITHMS",
    "AdvantageResult",
    "AlgorithmConfig",
    "GRPOConfig",
    "RLOOConfig",
    "ReinforceConfig",
    "RunningBaseline",
    "compute_advantages",
    "make_config",
    "policy_loss",
    "token_weights",
]

LossNormalization = Literal["rollout", "token"]

# --- configs ---------------------------------------------------------------------------


@dataclass
class _PolicyConfig:
    """Fields every algorithm shares: the clipped loss, KL and normalization."""

    clip_eps_low: float = 0.2
    """The importance ratio is clipped below at ``1 - clip_eps_low``; in [0, 1)."""
    clip_eps_high: float = 0.2
    """The ratio is clipped above at ``1 + clip_eps_high``; >= 0 (DAPO uses 0.28)."""
    kl_coef: float = 0.0
    """Weight of the k3 KL penalty to the reference policy, the weights RL started from
    (after a warm start or ``init_from``: those); 0 turns it off (then no reference
    logprobs are needed)."""
    loss_normalization: LossNormalization = "rollout"
    """``rollout``: average each rollout's tokens, then over rollouts (long episodes do
    not dominate); ``token``: every trained token of the batch weighs the same."""
    skip_zero_variance: bool = True
    """Skip (and count) groups whose rollouts all have the same return."""
    is_cap: float = 2.0
    """Truncation of the behaviour importance weight ``pi_prox / pi_behaviour`` for
    samples of older policy versions (async training); >= 1. Fresh samples never use it
    (see ``boltrl_trainer.offpolicy``)."""

    name = "policy"  # prefix of error messages, e.g. ``grpo.kl_coef``

    def __post_init__(self) -> None:
        self.validate()

    def _fail(self, field: str, problem: str, fix: str) -> InvalidInput:
        got = getattr(self, field)
        return InvalidInput(f"{self.name}.{field}: {problem} (got {got!r}); {fix}")

    def _number(self, field: str) -> float:
        value = getattr(self, field)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self._fail(field, "must be a number", "write it as e.g. 0.2")
        if not math.isfinite(value):
            raise self._fail(field, "must be finite", "use a finite number")
        return float(value)

    def validate(self) -> None:
        """Raise ``InvalidInput`` naming the first bad field and how to fix it."""
        if not 0.0 <= self._number("clip_eps_low") < 1.0:
            raise self._fail("clip_eps_low", "must be in [0, 1)", "0.2 is the usual value")
        if self._number("clip_eps_high") < 0.0:
            raise self._fail("clip_eps_high", "must be >= 0", "0.2 (or 0.28 as in DAPO)")
        if self._number("kl_coef") < 0.0:
            raise self._fail("kl_coef", "must be >= 0", "use 0 to disable the KL penalty")
        if self.loss_normalization not in ("rollout", "token"):
            raise self._fail("loss_normalization", "must be 'rollout' or 'token'", "use 'rollout'")
        if not isinstance(self.skip_zero_variance, bool):
            raise self._fail("skip_zero_variance", "must be true or false", "use true")
        if self._number("is_cap") < 1.0:
            raise self._fail("is_cap", "must be >= 1", "2.0 is the usual value")


@dataclass
class GRPOConfig(_PolicyConfig):
    """Group Relative Policy Optimization: advantage = (return - group mean) / group std."""

    scale_by_std: bool = True
    """Divide by the group's sample std (+ ``std_eps``); False keeps raw differences."""
    std_eps: float = 1e-6
    """Added to the group std before dividing; > 0."""

    name = "grpo"

    def validate(self) -> None:
        super().validate()
        if not isinstance(self.scale_by_std, bool):
            raise self._fail("scale_by_std", "must be true or false", "use true")
        if self._number("std_eps") <= 0.0:
            raise self._fail("std_eps", "must be > 0", "1e-6 is the usual value")


@dataclass
class RLOOConfig(_PolicyConfig):
    """REINFORCE Leave-One-Out: advantage = return - mean of the group's other returns."""

    name = "rloo"


@dataclass
class ReinforceConfig(_PolicyConfig):
    """REINFORCE with a baseline: advantage = return - baseline."""

    baseline: Literal["batch", "running", "none"] = "batch"
    """``batch``: mean return of this batch; ``running``: exponential running mean of past
    batches (state in a ``RunningBaseline``); ``none``: no baseline."""
    baseline_momentum: float = 0.9
    """Running baseline update ``b <- m * b + (1 - m) * batch_mean``; in [0, 1)."""
    skip_zero_variance: bool = False
    """Skip (and count) task groups whose rollouts all have the same return; off by
    default because the baseline is not per group."""

    name = "reinforce"

    def validate(self) -> None:
        super().validate()
        if self.baseline not in ("batch", "running", "none"):
            raise self._fail("baseline", "must be 'batch', 'running' or 'none'", "use 'batch'")
        if not 0.0 <= self._number("baseline_momentum") < 1.0:
            raise self._fail("baseline_momentum", "must be in [0, 1)", "0.9 is the usual value")


AlgorithmConfig = GRPOConfig | RLOOConfig | ReinforceConfig
ALGORITHMS: dict[str, type[GRPOConfig] | type[RLOOConfig] | type[ReinforceConfig]] = {
    "grpo": GRPOConfig,
    "rloo": RLOOConfig,
    "reinforce": ReinforceConfig,
}
"""Config class by algorithm name, for the CLI and YAML configs."""


def make_config(name: str, settings: Mapping[str, Any] | None = None) -> AlgorithmConfig:
    """The validated config of algorithm ``name`` from plain settings (a YAML mapping)."""
    cls = ALGORITHMS.get(name)
    if cls is None:
        raise InvalidInput(f"algorithm: unknown {name!r}; use one of {', '.join(ALGORITHMS)}")
    known = [f.name for f in fields(cls)]
    for key in settings or {}:
        if key not in known:
            raise InvalidInput(f"{cls.name}.{key}: unknown setting; known: {', '.join(known)}")
    return cls(**(settings or {}))


@dataclass
class RunningBaseline:
    """REINFORCE's running baseline, kept by the trainer across steps (checkpoint it)."""

    value: float | None = None
    """Current baseline; None before the first batch (which then uses its own mean)."""


# --- advantages ------------------------------------------------------------------------


class AdvantageResult(NamedTuple):
    """What ``compute_advantages`` returns."""

    advantages: torch.Tensor
    """``[T]`` float32, one per transition (0 for skipped ones)."""
    keep: torch.Tensor
    """``[T]`` bool, False for transitions of skipped groups."""
    stats: dict[str, float]
    """``rollouts``, ``groups``, ``skipped_groups``, ``skipped_rollouts``,
    ``kept_transitions``, ``return_mean``, ``return_std``, ``baseline`` (REINFORCE)."""


def _returns_and_groups(
    transitions: Sequence[Transition],
    returns: Mapping[str, float] | None,
    groups: Mapping[str, str] | None,
) -> tuple[dict[str, float], dict[str, list[str]]]:
    """Return of every rollout and the rollout ids of every group (first-seen order)."""
    first: dict[str, Transition] = {}
    for t in transitions:
        if t.rollout_id not in first or t.step < first[t.rollout_id].step:
            first[t.rollout_id] = t
    ret = {rid: t.reward for rid, t in first.items()} if returns is None else dict(returns)
    missing = [rid for rid in first if rid not in ret]
    if missing:
        raise InvalidInput(f"rewards_by_rollout: no return for rollout(s) {missing[:5]}")
    members: dict[str, list[str]] = {}
    for rid in ret:
        if groups is not None and rid in groups:
            group = groups[rid]
        elif rid in first:
            group = first[rid].group
        else:
            raise InvalidInput(
                f"rewards_by_rollout: rollout {rid} has no transitions, so its group is "
                "unknown; pass groups={rollout_id: group} or leave it out"
            )
        members.setdefault(group, []).append(rid)
    return ret, members


def _baselines(
    values: list[float], cfg: AlgorithmConfig, batch_baseline: float
) -> tuple[list[float], float]:
    """Per-rollout baselines and the group's scale for one group's returns."""
    n = len(values)
    if isinstance(cfg, ReinforceConfig):
        return [batch_baseline] * n, 1.0
    if isinstance(cfg, RLOOConfig):
        total = sum(values)
        return [(total - v) / (n - 1) if n > 1 else v for v in values], 1.0
    mean = sum(values) / n
    scale = 1.0
    if cfg.scale_by_std:
        var = sum((v - mean) ** 2 for v in values) / (n - 1) if n > 1 else 0.0
        scale = math.sqrt(var) + cfg.std_eps
    return [mean] * n, scale


def _batch_baseline(
    cfg: AlgorithmConfig, batch_mean: float, running: RunningBaseline | None
) -> float:
    """REINFORCE's baseline for this batch (updating the running state); the mean otherwise."""
    if not isinstance(cfg, ReinforceConfig) or cfg.baseline == "batch":
        return batch_mean
    if cfg.baseline == "none":
        return 0.0
    if running is None:
        raise InvalidInput("running: reinforce.baseline='running' needs a RunningBaseline state")
    if running.value is None:
        running.value = batch_mean
        return batch_mean
    value = running.value
    m = cfg.baseline_momentum
    running.value = m * value + (1 - m) * batch_mean
    return value


def compute_advantages(
    transitions: Sequence[Transition],
    rewards_by_rollout: Mapping[str, float] | None,
    cfg: AlgorithmConfig,
    *,
    groups: Mapping[str, str] | None = None,
    running: RunningBaseline | None = None,
) -> AdvantageResult:
    """Advantages per transition from rollout returns grouped by task (module docstring).

    ``rewards_by_rollout`` maps rollout id to its return (None: each rollout's first
    transition's reward, which is its return under either credit mode). Rollouts listed
    there without transitions still count in their group's baseline when ``groups``
    names their group. ``running`` holds the state of REINFORCE's running baseline and
    is updated in place (the advantages use the value from before this batch).
    """
    import torch

    cfg.validate()
    returns, members = _returns_and_groups(transitions, rewards_by_rollout, groups)
    values = list(returns.values())
    batch_mean = sum(values) / len(values) if values else 0.0
    batch_baseline = _batch_baseline(cfg, batch_mean, running)

    baseline: dict[str, float] = {}
    scale: dict[str, float] = {}
    skipped_groups = skipped_rollouts = 0
    for rids in members.values():
        group = [returns[r] for r in rids]
        if cfg.skip_zero_variance and max(group) - min(group) <= 1e-12:
            skipped_groups += 1
            skipped_rollouts += len(rids)
            continue
        b, s = _baselines(group, cfg, batch_baseline)
        for rid, bi in zip(rids, b, strict=True):
            baseline[rid], scale[rid] = bi, s

    adv = [
        (t.reward - baseline[t.rollout_id]) / scale[t.rollout_id]
        if t.rollout_id in baseline
        else 0.0
        for t in transitions
    ]
    keep = [t.rollout_id in baseline for t in transitions]
    stats = {
        "rollouts": float(len(returns)),
        "groups": float(len(members)),
        "skipped_groups": float(skipped_groups),
        "skipped_rollouts": float(skipped_rollouts),
        "kept_transitions": float(sum(keep)),
        "return_mean": batch_mean,
        "return_std": math.sqrt(sum((v - batch_mean) ** 2 for v in values) / max(len(values), 1)),
    }
    if isinstance(cfg, ReinforceConfig):
        stats["baseline"] = batch_baseline
    return AdvantageResult(
        torch.tensor(adv, dtype=torch.float32), torch.tensor(keep, dtype=torch.bool), stats
    )


# --- loss ------------------------------------------------------------------------------


def token_weights(
    mask: torch.Tensor,
    rollout_index: torch.Tensor,
    normalization: LossNormalization = "rollout",
    rollout_tokens: torch.Tensor | None = None,
) -> torch.Tensor:
    """``[B, L]`` weights that turn summed token losses into the normalized batch loss.

    ``rollout``: ``mask / (tokens of the row's rollout * rollouts)``, so each rollout's
    tokens average to one term and rollouts count equally; ``token``: ``mask / tokens``.
    ``rollout_tokens`` (``[R]``, trained tokens of each rollout over the *whole* batch)
    lets micro-batches of one batch sum to exactly the full-batch loss; None counts the
    tokens of ``mask`` itself.
    """
    import torch

    m = mask.to(torch.float32)
    if rollout_tokens is None:
        size = int(rollout_index.max().item()) + 1 if rollout_index.numel() else 0
        rollout_tokens = torch.zeros(size, dtype=torch.float32, device=m.device)
        rollout_tokens.index_add_(0, rollout_index, m.sum(dim=1))
    counts = rollout_tokens.to(device=m.device, dtype=torch.float32)
    if normalization == "token":
        return m / counts.sum().clamp(min=1.0)
    rollouts = (counts > 0).sum().clamp(min=1).to(torch.float32)
    per_row = counts[rollout_index].clamp(min=1.0) * rollouts  # [B]
    return m / per_row[:, None]


def _check_shapes(
    new: torch.Tensor,
    old: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    rollout_index: torch.Tensor,
    ref: torch.Tensor | None,
) -> None:
    named = {"old_logprobs": old, "mask": mask}
    if ref is not None:
        named["ref_logprobs"] = ref
    for name, t in named.items():
        if t.shape != new.shape:
            raise InvalidInput(f"{name}: shape {tuple(t.shape)} != new_logprobs {tuple(new.shape)}")
    if advantages.shape not in (new.shape, new.shape[:1]):
        raise InvalidInput(f"advantages: shape {tuple(advantages.shape)} must be [B] or [B, L]")
    if rollout_index.shape != new.shape[:1]:
        raise InvalidInput(f"rollout_index: shape {tuple(rollout_index.shape)} must be [B]")


def policy_loss(
    new_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    rollout_index: torch.Tensor,
    cfg: AlgorithmConfig,
    ref_logprobs: torch.Tensor | None = None,
    *,
    rollout_tokens: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    prox_logprobs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO-clipped policy-gradient loss (+ k3 KL to the reference) and its metrics.

    Shapes: ``new_logprobs`` (with grad), ``old_logprobs`` (recorded at sampling),
    ``mask`` (1 = trained token) and ``ref_logprobs``: ``[B, L]``; ``advantages``:
    ``[B]`` (or ``[B, L]``); ``rollout_index``: ``[B]`` long, the rollout each row belongs
    to (see ``batching.index_rollouts``). ``entropy`` (``[B, L]``, optional) is only reported.
    Metrics are plain means over trained tokens: ``clip_frac``, ``approx_kl`` (k3 of
    old vs new), ``logprob_mismatch`` (mean ``|new - old|``: on the first update of a
    batch, the gap between the gateway's and the trainer's logprobs), ``ratio_max``,
    ``kl_ref`` and ``entropy`` when given, ``tokens``.

    ``prox_logprobs`` (``[B, L]``, no grad): the proximal policy's logprobs for samples
    of older versions; the ratio is then ``new / prox`` and each token's clipped term is
    weighted by ``min(exp(prox - old), cfg.is_cap)`` (``offpolicy.behaviour_weights``;
    metrics add ``is_weight_mean|std|max`` and ``truncated_frac``). None: the on-policy
    loss, untouched.
    """
    import torch

    cfg.validate()
    _check_shapes(new_logprobs, old_logprobs, advantages, mask, rollout_index, ref_logprobs)
    if prox_logprobs is not None and prox_logprobs.shape != new_logprobs.shape:
        raise InvalidInput(
            f"prox_logprobs: shape {tuple(prox_logprobs.shape)} != new_logprobs "
            f"{tuple(new_logprobs.shape)}"
        )
    if cfg.kl_coef > 0 and ref_logprobs is None:
        raise InvalidInput(
            f"ref_logprobs: {cfg.name}.kl_coef={cfg.kl_coef} needs the reference policy's "
            "logprobs; pass ref_logprobs or set kl_coef to 0"
        )
    trained = mask.bool()
    adv = advantages[:, None] if advantages.dim() == 1 else advantages
    # Untrained positions (padding, observation tokens) are zeroed before exp: no inf/nan.
    anchor = old_logprobs if prox_logprobs is None else prox_logprobs.detach()
    logratio = torch.where(trained, new_logprobs - anchor, 0.0)
    ratio = torch.exp(logratio)
    surrogate = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - cfg.clip_eps_low, 1.0 + cfg.clip_eps_high)
    per_token = torch.maximum(surrogate, clipped)
    is_metrics: dict[str, float] = {}
    if prox_logprobs is not None:
        from boltrl_trainer.offpolicy import behaviour_weights

        bw = behaviour_weights(prox_logprobs, old_logprobs, mask, cfg.is_cap)
        per_token = per_token * bw.weights
        is_metrics = bw.metrics
    kl_ref = None
    if ref_logprobs is not None and cfg.kl_coef > 0:
        d = torch.where(trained, ref_logprobs - new_logprobs, 0.0)
        kl_ref = torch.exp(d) - d - 1.0  # k3: unbiased, always >= 0
        per_token = per_token + cfg.kl_coef * kl_ref
    w = token_weights(mask, rollout_index, cfg.loss_normalization, rollout_tokens)
    loss = (per_token * w).sum()
    with torch.no_grad():
        metrics = _loss_metrics(trained, logratio, surrogate, clipped, kl_ref, entropy)
    return loss, {**metrics, **is_metrics}


def _loss_metrics(
    trained: torch.Tensor,
    logratio: torch.Tensor,
    surrogate: torch.Tensor,
    clipped: torch.Tensor,
    kl_ref: torch.Tensor | None,
    entropy: torch.Tensor | None,
) -> dict[str, float]:
    """Means over trained tokens, fetched from the device in one transfer."""
    import torch

    def mean(x: torch.Tensor) -> torch.Tensor:
        return torch.where(trained, x, 0.0).sum() / n

    n = trained.sum().clamp(min=1).to(torch.float32)
    ratio = logratio.exp()
    values = {
        # clipped term active: the token gives no gradient
        "clip_frac": mean((clipped > surrogate).float()),
        "approx_kl": mean(ratio - 1.0 - logratio),  # k3 estimate of KL(old || new)
        "logprob_mismatch": mean(logratio.abs()),
        "ratio_max": torch.where(trained, ratio, 0.0).max() if trained.any() else n * 0,
        "tokens": trained.sum().to(torch.float32),
    }
    if kl_ref is not None:
        values["kl_ref"] = mean(kl_ref)
    if entropy is not None:
        values["entropy"] = mean(entropy)
    floats = torch.stack([v.to(torch.float32) for v in values.values()]).tolist()
    return dict(zip(values, floats, strict=True))
