"""One score for a rollout: the return training uses, for emitted-only, returned and
mixed rewards, under both credit modes, without token ids; and the set summary."""

from __future__ import annotations

import math

import pytest

from boltrl.credit import CreditConfig, MissingTokenIds, transitions
from boltrl.errors import InvalidInput
from boltrl.records import (
    Attempt,
    AttemptOutcome,
    LLMCall,
    RewardEvent,
    Rollout,
    RolloutStatus,
    Task,
)
from boltrl.scoring import ScoreSummary, rollout_score, summarize_scores


def _call(cid: str, seq: int, *, ids: bool = True, attempt: int = 1) -> LLMCall:
    return LLMCall(
        id=cid,
        seq=seq,
        rollout_id="ro",
        attempt=attempt,
        prompt_token_ids=[1, 2] if ids else None,
        response_token_ids=[3] if ids else None,
        response_logprobs=[-0.5] if ids else None,
        policy_version=0,
    )


def _rew(value: float, seq: int, *, final: bool = False, attempt: int = 1) -> RewardEvent:
    return RewardEvent(id=f"rew-{seq}", seq=seq, value=value, final=final, attempt=attempt)


def _rollout(
    calls: list[LLMCall],
    rewards: list[RewardEvent],
    *,
    reward: float | None = None,
    status: RolloutStatus = RolloutStatus.SUCCEEDED,
    attempts: int = 1,
) -> Rollout:
    return Rollout(
        id="ro",
        task=Task(id="t", input={}),
        status=status,
        reward=reward,
        attempts=[
            Attempt(
                rollout_id="ro",
                number=n,
                worker_id="w",
                started_at=0.0,
                lease_expires_at=0.0,
                last_heartbeat=0.0,
                outcome=AttemptOutcome.SUCCEEDED,
            )
            for n in range(1, attempts + 1)
        ],
        calls=calls,
        rewards=rewards,
    )


def test_an_agent_that_only_emits_rewards_scores_their_sum_as_its_transitions_carry() -> None:
    r = _rollout([_call("c1", 1), _call("c2", 3)], [_rew(0.25, 2), _rew(0.5, 4)])
    assert rollout_score(r) == 0.75
    assert [t.reward for t in transitions(r)] == [0.75, 0.75]


def test_a_returned_reward_is_the_score_under_final_credit() -> None:
    r = _rollout([_call("c1", 1)], [_rew(0.25, 2)], reward=1.0)
    assert rollout_score(r) == 1.0 == transitions(r)[0].reward


def test_discounted_credit_scores_the_discounted_return_from_the_start() -> None:
    r = _rollout([_call("c1", 1), _call("c2", 3)], [_rew(1.0, 2), _rew(2.0, 4)], reward=4.0)
    # step 0 gets 1.0, step 1 gets 2.0 + the final 4.0
    assert rollout_score(r, "discounted") == 7.0 == transitions(r, "discounted")[0].reward
    half = CreditConfig(mode="discounted", gamma=0.5)
    assert rollout_score(r, half) == 1.0 + 0.5 * 6.0 == transitions(r, half)[0].reward


def test_only_the_final_attempts_rewards_count() -> None:
    r = _rollout(
        [_call("c1", 1), _call("c2", 3, attempt=2)],
        [_rew(5.0, 2), _rew(0.5, 4, attempt=2)],
        attempts=2,
    )
    assert rollout_score(r) == 0.5


def test_a_rollout_without_token_ids_still_has_a_score() -> None:
    r = _rollout([_call("c1", 1, ids=False)], [_rew(0.5, 2)])
    with pytest.raises(MissingTokenIds):
        transitions(r)
    assert rollout_score(r) == 0.5
    assert rollout_score(r, "discounted") == 0.5


def test_no_reward_at_all_scores_zero_and_a_failed_rollout_has_no_score() -> None:
    assert rollout_score(_rollout([_call("c1", 1)], [])) == 0.0
    failed = _rollout([_call("c1", 1)], [_rew(0.5, 2)], status=RolloutStatus.FAILED)
    assert rollout_score(failed) is None
    with pytest.raises(InvalidInput, match=r"credit\.mode"):
        rollout_score(_rollout([], []), "greedy")


def test_a_set_summary_counts_failed_rollouts_as_told() -> None:
    ok = [_rollout([_call("c1", 1)], [_rew(v, 2)]) for v in (0.0, 1.0, 0.5)]
    failed = _rollout([], [], status=RolloutStatus.FAILED)
    train = summarize_scores([*ok, failed])
    assert train == ScoreSummary(0.5, math.sqrt(1 / 6), 3, 1)
    held_out = summarize_scores([*ok, failed], failed_as=0.0)
    assert (held_out.mean, held_out.counted, held_out.failed) == (0.375, 4, 1)
    assert held_out.std == pytest.approx(math.sqrt((0.375**2 * 2 + 0.625**2 + 0.125**2) / 4))
    assert summarize_scores([]) == ScoreSummary(0.0, 0.0, 0, 0)
