"""One score for a rollout: the return training uses, wherever a reward is reported.

``boltrl eval``'s table and JSON, the trainer's train/val metrics, the progress line and
the dashboard all report this score, so an agent is scored the same everywhere and the
same as training trains it.

The rule. A rollout that succeeded scores its return under the credit rules
(:func:`boltrl.credit.rollout_return` of its final attempt), which is what its first
transition carries and what the trainer's group baselines use:

- ``final`` credit (the default): the agent's returned reward when it returned one;
  otherwise the last reward event marked ``final`` of that attempt; otherwise the sum of
  the attempt's ``emit_reward`` events; 0.0 when there are none.
- ``discounted`` credit: ``sum_k gamma^k r_k`` over the attempt's steps, where ``r_k``
  holds the intermediate rewards placed on step ``k`` and the last step also the final
  reward (with ``gamma = 1``: the returned reward plus every emitted one).

A rollout that did not succeed has no score (None): training drops it, and reports say
how a summary counts it (``failed_as``). No token ids are needed: a rollout served by a
backend that reports none still has a score.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from boltrl.credit import CreditConfig, rollout_return
from boltrl.records import Rollout, RolloutStatus

__all__ = ["ScoreSummary", "rollout_score", "summarize_scores"]


def rollout_score(rollout: Rollout, credit: CreditConfig | str = "final") -> float | None:
    """The rollout's score under ``credit`` (see the module docstring), None unless it
    succeeded. Raises ``InvalidInput`` for a bad credit config (the message names the
    field)."""
    if rollout.status != RolloutStatus.SUCCEEDED:
        return None
    return rollout_return(rollout, credit)


@dataclass(frozen=True)
class ScoreSummary:
    """Mean and spread of a rollout set's scores."""

    mean: float
    """Mean score (0.0 for an empty set)."""
    std: float
    """Population standard deviation of the scores counted (0.0 below two)."""
    counted: int
    """Scores the mean is over (failed rollouts included when ``failed_as`` is set)."""
    failed: int
    """Rollouts that did not succeed."""


def summarize_scores(
    rollouts: Iterable[Rollout],
    credit: CreditConfig | str = "final",
    *,
    failed_as: float | None = None,
) -> ScoreSummary:
    """Mean and spread of the rollouts' scores (:func:`rollout_score`).

    ``failed_as``: what a rollout that did not succeed counts as (``0.0`` for held-out
    evaluation, where a crash is a wrong answer); None leaves it out (training, which
    drops it). Either way it is counted in ``failed``.
    """
    scores: list[float] = []
    failed = 0
    for r in rollouts:
        s = rollout_score(r, credit)
        if s is None:
            failed += 1
            if failed_as is None:
                continue
            s = failed_as
        scores.append(s)
    if not scores:
        return ScoreSummary(0.0, 0.0, 0, failed)
    mean = math.fsum(scores) / len(scores)
    std = math.sqrt(math.fsum((x - mean) ** 2 for x in scores) / len(scores))
    return ScoreSummary(mean, std, len(scores), failed)
