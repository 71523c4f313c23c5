"""Training on samples an older policy drew: the staleness bound and the behaviour weights.

Three policies meet in an off-policy update (decoupled PPO, as AReaL: Fu et al. 2025):

- the **behaviour** policy ``pi_b``: the weights that sampled a token; the gateway
  recorded its logprob and ``policy_version`` with every call;
- the **proximal** policy ``pi_prox``: the trainer's weights at the start of this update
  (their logprobs, without grad, before the first optimizer step: the torch backend
  reuses its first epoch's forward pass, which runs exactly those weights);
- the current policy ``pi_theta`` being optimized.

The loss (``algorithms.policy_loss`` with ``prox_logprobs``) clips the ratio
``pi_theta / pi_prox`` as PPO does, so the trust region is measured from where the
trainer stands, not from a policy several updates old (whose ratios would sit outside
the clip range from the first step and give no gradient at all), and multiplies each
token's clipped surrogate by the behaviour weight ``w = pi_prox / pi_b``, which corrects
the expectation for having sampled from ``pi_b``. ``w`` is detached (it is a weight of
the sample, not a function to optimize) and truncated at ``is_cap``: a token the policy
now likes far more than when it was sampled would otherwise dominate the batch's
gradient (the variance of importance sampling grows with ``w``). Truncation (TIS) keeps
such a token at a bounded weight and biases the estimate only where ``w > is_cap``;
AReaL instead masks those tokens out, which throws away exactly the tokens the policy
moved most toward. The default cap 2.0 is the middle of what TIS and AReaL use (2-5) for
a staleness of a few versions; the share truncated is reported (``truncated_frac``) so a
cap that bites too often shows.

Fresh samples (staleness 0: sampled by the very weights being updated) have
``pi_prox = pi_b`` up to the gateway/trainer numeric mismatch, so the update uses the
behaviour logprobs as proximal ones for them: no extra forward pass, and a batch with
no stale sample takes the synchronous loss path unchanged, bit for bit.

Staleness is ``current_version - transition.policy_version``. A transition without a
version (None: recorded by a backend that does not label versions, or produced outside
a training run) counts as current: the trainer cannot tell how old it is, and dropping
every such transition would make unlabelled backends untrainable; such transitions are
counted (``offpolicy/unversioned``) so the assumption is visible. Transitions older than
``max_staleness`` are dropped before advantages are computed and counted, never mixed in.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from boltrl.errors import InvalidInput
from boltrl.records import Transition

if TYPE_CHECKING:
    import torch

__all__ = [
    "DEFAULT_IS_CAP",
    "BehaviourWeights",
    "StalenessStats",
    "behaviour_weights",
    "select_fresh",
    "staleness_of",
]

DEFAULT_IS_CAP = 2.0
"""Truncation of the behaviour weight ``pi_prox / pi_b`` (module docstring)."""


@dataclass
class StalenessStats:
    """How old a batch's transitions were, counted before and after the bound."""

    histogram: dict[int, int] = field(default_factory=dict)
    """Staleness (versions) -> transitions seen, dropped ones included."""
    dropped: int = 0
    """Transitions older than ``max_staleness``, left out of the batch."""
    unversioned: int = 0
    """Transitions without a policy version (counted as current)."""
    max_staleness: int | None = None
    """The bound applied (None: no bound)."""

    @property
    def kept(self) -> int:
        return sum(self.histogram.values()) - self.dropped

    def metrics(self) -> dict[str, float]:
        """``offpolicy/*`` figures: dropped, kept, staleness mean and max (of the kept
        transitions), unversioned, and ``offpolicy/staleness_<k>`` per histogram bin."""
        bound = self.max_staleness
        kept = {s: n for s, n in self.histogram.items() if bound is None or s <= bound}
        total = sum(kept.values())
        out = {
            "offpolicy/dropped": float(self.dropped),
            "offpolicy/kept": float(total),
            "offpolicy/unversioned": float(self.unversioned),
            "offpolicy/staleness_mean": sum(s * n for s, n in kept.items()) / total
            if total
            else 0.0,
            "offpolicy/staleness_max": float(max(kept, default=0)),
        }
        for s in sorted(self.histogram):
            out[f"offpolicy/staleness_{s}"] = float(self.histogram[s])
        return out


def staleness_of(t: Transition, current_version: int) -> int:
    """Versions between the weights that sampled ``t`` and ``current_version`` (0 when
    ``t`` carries no version; see the module docstring)."""
    if t.policy_version is None:
        return 0
    return current_version - t.policy_version


def select_fresh(
    transitions: Sequence[Transition], current_version: int, max_staleness: int | None
) -> tuple[list[Transition], StalenessStats]:
    """The transitions at most ``max_staleness`` versions old (order kept), and the counts.

    ``max_staleness`` None keeps everything (the histogram is still filled). A transition
    from a *newer* version than ``current_version`` means the caller passed the wrong
    version; that raises ``InvalidInput`` rather than train on a confused batch.
    """
    if max_staleness is not None and (
        isinstance(max_staleness, bool) or not isinstance(max_staleness, int) or max_staleness < 0
    ):
        raise InvalidInput(f"max_staleness: must be an integer >= 0 (got {max_staleness!r})")
    stats = StalenessStats(max_staleness=max_staleness)
    kept: list[Transition] = []
    for t in transitions:
        s = staleness_of(t, current_version)
        if s < 0:
            raise InvalidInput(
                f"policy_version: transition of rollout {t.rollout_id} was sampled by "
                f"version {t.policy_version}, newer than the current {current_version}"
            )
        stats.histogram[s] = stats.histogram.get(s, 0) + 1
        if t.policy_version is None:
            stats.unversioned += 1
        if max_staleness is not None and s > max_staleness:
            stats.dropped += 1
        else:
            kept.append(t)
    return kept, stats


@dataclass(frozen=True)
class BehaviourWeights:
    """What ``behaviour_weights`` returns."""

    weights: torch.Tensor
    """``[B, L]`` truncated ``exp(prox - behaviour)``, detached; 1 at untrained positions."""
    metrics: dict[str, float]
    """``is_weight_mean``, ``is_weight_std``, ``is_weight_max`` (before truncation) and
    ``truncated_frac``, over trained tokens."""


def behaviour_weights(
    prox_logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    mask: torch.Tensor,
    is_cap: float = DEFAULT_IS_CAP,
) -> BehaviourWeights:
    """Per-token ``min(pi_prox / pi_b, is_cap)`` (``[B, L]`` tensors), without grad."""
    import torch

    if not (isinstance(is_cap, int | float) and math.isfinite(is_cap) and is_cap >= 1.0):
        raise InvalidInput(f"is_cap: must be a finite number >= 1 (got {is_cap!r})")
    with torch.no_grad():
        trained = mask.bool()
        log_w = torch.where(trained, prox_logprobs.detach() - behaviour_logprobs, 0.0)
        raw = log_w.exp()
        weights = raw.clamp(max=float(is_cap))
        n = trained.sum()
        if int(n) == 0:
            zero = {"is_weight_mean": 0.0, "is_weight_std": 0.0, "is_weight_max": 0.0}
            return BehaviourWeights(weights, {**zero, "truncated_frac": 0.0})
        picked = raw[trained]
        values = torch.stack(
            [
                picked.mean(),
                picked.std(unbiased=False),
                picked.max(),
                (picked > is_cap).float().mean(),
            ]
        ).tolist()
    names = ("is_weight_mean", "is_weight_std", "is_weight_max", "truncated_frac")
    return BehaviourWeights(weights, dict(zip(names, values, strict=True)))
