"""Credit assignment on hand-built rollouts: each mode, the agent filter, prefix merge,
missing token ids, skipped calls and attempt selection, compared as whole transitions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

import boltrl
from boltrl.credit import (
    CreditConfig,
    MissingTokenIds,
    final_reward,
    rollout_return,
    transitions,
    transitions_batch,
)
from boltrl.errors import InvalidInput
from boltrl.records import (
    Attempt,
    AttemptOutcome,
    LLMCall,
    RewardEvent,
    Rollout,
    RolloutStatus,
    Task,
    Transition,
)

RID = "ro-1"


def lps(n: int, base: float = -0.1) -> list[float]:
    return [base * (i + 1) for i in range(n)]


def call(
    cid: str,
    seq: int,
    prompt: list[int] | None,
    response: list[int] | None,
    *,
    agent: str | None = None,
    attempt: int = 1,
    status: str = "ok",
    cached: bool = False,
    version: int | None = 0,
    logprobs: list[float] | str | None = "auto",
) -> LLMCall:
    if logprobs == "auto":
        logprobs = lps(len(response)) if response is not None else None
    return LLMCall(
        id=cid,
        seq=seq,
        rollout_id=RID,
        attempt=attempt,
        agent=agent,
        prompt_token_ids=prompt,
        response_token_ids=response,
        response_logprobs=logprobs,  # type: ignore[arg-type]
        policy_version=version,
        status=status,  # type: ignore[arg-type]
        cached=cached,
    )


def rew(
    value: float, seq: int, *, call_id: str | None = None, final: bool = False, attempt: int = 1
) -> RewardEvent:
    return RewardEvent(
        id=f"rew-{seq}", seq=seq, value=value, call_id=call_id, final=final, attempt=attempt
    )


def attempt(n: int) -> Attempt:
    return Attempt(
        rollout_id=RID,
        number=n,
        worker_id="w",
        started_at=0.0,
        lease_expires_at=0.0,
        last_heartbeat=0.0,
        outcome=AttemptOutcome.SUCCEEDED,
    )


def rollout(
    calls: Sequence[LLMCall],
    rewards: Sequence[RewardEvent] = (),
    *,
    reward: float | None = None,
    attempts: Sequence[int] = (1,),
    group: str | None = None,
) -> Rollout:
    return Rollout(
        id=RID,
        task=Task(id="task-1", input={"q": 1}, group=group),
        status=RolloutStatus.SUCCEEDED,
        reward=reward,
        attempts=[attempt(n) for n in attempts],
        calls=list(calls),
        rewards=list(rewards),
    )


def tr(
    step: int,
    state: list[int],
    action: list[int],
    reward: float,
    done: bool,
    call_ids: list[str],
    *,
    logprobs: list[float] | None = None,
    mask: list[int] | None = None,
    agent: str | None = None,
    version: int | None = 0,
    group: str = "task-1",
) -> Transition:
    return Transition(
        rollout_id=RID,
        task_id="task-1",
        group=group,
        step=step,
        agent=agent,
        state=state,
        action=action,
        action_logprobs=logprobs if logprobs is not None else lps(len(action)),
        action_mask=mask if mask is not None else [1] * len(action),
        reward=reward,
        done=done,
        policy_version=version,
        call_ids=call_ids,
    )


def three_calls() -> list[LLMCall]:
    return [
        call("c1", 1, [1, 2], [3, 4]),
        call("c2", 3, [5], [6]),
        call("c3", 5, [7, 8, 9], [10, 11, 12]),
    ]


# --- final -------------------------------------------------------------------------------


def test_final_broadcasts_final_reward_and_ignores_intermediate() -> None:
    r = rollout(three_calls(), [rew(0.5, 2), rew(1.0, 6, final=True)], reward=1.0, group="g")
    assert transitions(r) == [
        tr(0, [1, 2], [3, 4], 1.0, False, ["c1"], group="g"),
        tr(1, [5], [6], 1.0, False, ["c2"], group="g"),
        tr(2, [7, 8, 9], [10, 11, 12], 1.0, True, ["c3"], group="g"),
    ]
    assert rollout_return(r) == 1.0


def test_final_without_final_reward_falls_back_to_sum_of_intermediate_then_zero() -> None:
    calls = three_calls()
    with_emitted = rollout(calls, [rew(0.5, 2), rew(0.25, 4)])
    assert [t.reward for t in transitions(with_emitted)] == [0.75, 0.75, 0.75]
    assert [t.reward for t in transitions(rollout(calls))] == [0.0, 0.0, 0.0]


def test_final_reward_leaves_out_intermediate_rewards_and_follows_the_attempt() -> None:
    calls = three_calls()
    # the returned reward; else the last final event; else None (never the bonuses' sum)
    assert final_reward(rollout(calls, [rew(0.5, 2)], reward=0.25), "discounted") == 0.25
    assert final_reward(rollout(calls, [rew(0.5, 2), rew(0.75, 6, final=True)])) == 0.75
    assert final_reward(rollout(calls, [rew(0.5, 2)])) is None
    two = [call("a1", 1, [1], [2], attempt=1), call("b1", 10, [1], [3], attempt=2)]
    rewards = [rew(0.5, 2, final=True, attempt=1), rew(0.9, 11, final=True, attempt=2)]
    r = rollout(two, rewards, reward=0.9, attempts=(1, 2))
    assert (final_reward(r), final_reward(r, "final", attempt=1)) == (0.9, 0.5)
    with pytest.raises(InvalidInput, match=r"credit\.attempt"):
        final_reward(r, "final", attempt=3)


def test_calls_are_ordered_by_seq_and_lists_are_copies() -> None:
    calls = three_calls()
    r = rollout([calls[2], calls[0], calls[1]], reward=2.0)
    out = transitions(r)
    assert [t.call_ids for t in out] == [["c1"], ["c2"], ["c3"]]
    out[0].state.append(99)
    out[0].action.append(99)
    assert calls[0].prompt_token_ids == [1, 2] and calls[0].response_token_ids == [3, 4]


def test_transitions_roundtrip_json_and_validate() -> None:
    for t in transitions(rollout(three_calls(), reward=1.0), merge_prefix=True):
        assert Transition.model_validate_json(t.model_dump_json()) == t
        assert Transition.model_validate(t.model_dump()) == t


def test_top_level_export() -> None:
    assert boltrl.__getattr__("transitions") is transitions
    assert boltrl.__getattr__("CreditConfig") is CreditConfig


# --- discounted --------------------------------------------------------------------------


def test_discounted_return_to_go_places_rewards_by_call_id_and_seq() -> None:
    rewards = [
        rew(0.25, 0),  # before any call -> step 0
        rew(1.0, 2),  # after c1 -> step 0
        rew(2.0, 6, call_id="c3"),  # names c3 -> step 2
        rew(4.0, 7, final=True),  # the final reward, also on rollout.reward: counted once
    ]
    r = rollout(three_calls(), rewards, reward=4.0)
    # step rewards [1.25, 0, 6]; G2 = 6, G1 = 0 + .5*6 = 3, G0 = 1.25 + .5*3 = 2.75
    assert transitions(r, "discounted", gamma=0.5) == [
        tr(0, [1, 2], [3, 4], 2.75, False, ["c1"]),
        tr(1, [5], [6], 3.0, False, ["c2"]),
        tr(2, [7, 8, 9], [10, 11, 12], 6.0, True, ["c3"]),
    ]
    assert rollout_return(r, "discounted", gamma=0.5) == 2.75
    assert [t.reward for t in transitions(r, CreditConfig("discounted", gamma=1.0))] == [
        7.25,
        6.0,
        6.0,
    ]
    assert [t.reward for t in transitions(r, "discounted", gamma=0.0)] == [1.25, 0.0, 6.0]


def test_discounted_reward_named_call_earlier_than_its_seq() -> None:
    # emitted after c3 but naming c1: credited to step 0 only
    r = rollout(three_calls(), [rew(1.0, 9, call_id="c1")])
    assert [t.reward for t in transitions(r, "discounted", gamma=0.5)] == [1.0, 0.0, 0.0]


def test_discounted_final_reward_of_non_final_attempt_comes_from_its_final_event() -> None:
    calls = [call("a1", 1, [1], [2], attempt=1), call("b1", 10, [1], [3], attempt=2)]
    rewards = [rew(0.5, 2, final=True, attempt=1), rew(0.9, 11, final=True, attempt=2)]
    r = rollout(calls, rewards, reward=0.9, attempts=(1, 2))
    assert transitions(r, "discounted", attempt=1) == [tr(0, [1], [2], 0.5, True, ["a1"])]
    assert transitions(r, "final") == [tr(0, [1], [3], 0.9, True, ["b1"])]


# --- agent filter ------------------------------------------------------------------------


def multi_agent() -> list[LLMCall]:
    return [
        call("p1", 1, [1], [2], agent="planner"),
        call("s1", 2, [3], [4], agent="solver"),
        call("p2", 3, [5], [6], agent="planner"),
        call("s2", 5, [7], [8], agent="solver"),
    ]


def test_agent_filter_final_keeps_only_listed_agents() -> None:
    r = rollout(multi_agent(), reward=1.0)
    assert transitions(r, agents=["solver"]) == [
        tr(0, [3], [4], 1.0, False, ["s1"], agent="solver"),
        tr(1, [7], [8], 1.0, True, ["s2"], agent="solver"),
    ]
    assert len(transitions(r, agents=["solver", "planner"])) == 4
    assert transitions(r, agents=["nobody"]) == []


def test_agent_filter_discounted_rewards_attach_to_latest_kept_call_before_them() -> None:
    rewards = [
        rew(1.0, 1, call_id="p1"),  # names a context call before any kept call -> step 0
        rew(2.0, 4),  # after p2 (context) -> latest kept at or before: s1 -> step 0
        rew(4.0, 6, call_id="p2"),  # names p2 (seq 3) -> s1 -> step 0
        rew(8.0, 7, final=True),
    ]
    r = rollout(multi_agent(), rewards, reward=8.0)
    out = transitions(r, "discounted", gamma=0.5, agents=["solver"])
    # step rewards [7, 8]: G1 = 8, G0 = 7 + 4 = 11
    assert out == [
        tr(0, [3], [4], 11.0, False, ["s1"], agent="solver"),
        tr(1, [7], [8], 8.0, True, ["s2"], agent="solver"),
    ]
    assert rollout_return(r, "discounted", gamma=0.5, agents=["solver"]) == 11.0


# --- prefix merge ------------------------------------------------------------------------


def test_prefix_merge_masks_observation_tokens() -> None:
    calls = [
        call("c1", 1, [1, 2], [3, 4], logprobs=[-1.0, -2.0]),
        call("c2", 2, [1, 2, 3, 4, 9, 9], [5], logprobs=[-3.0]),
        call("c3", 3, [1, 2, 3, 4, 9, 9, 5, 7], [6], logprobs=[-4.0]),
    ]
    r = rollout(calls, reward=1.0)
    assert transitions(r, merge_prefix=True) == [
        tr(
            0,
            [1, 2],
            [3, 4, 9, 9, 5, 7, 6],
            1.0,
            True,
            ["c1", "c2", "c3"],
            logprobs=[-1.0, -2.0, 0.0, 0.0, -3.0, 0.0, -4.0],
            mask=[1, 1, 0, 0, 1, 0, 1],
        )
    ]
    # without merging: three plain transitions
    assert [t.call_ids for t in transitions(r)] == [["c1"], ["c2"], ["c3"]]


def test_prefix_merge_splits_on_mismatch() -> None:
    calls = [
        call("c1", 1, [1, 2], [3]),
        call("c2", 2, [1, 2, 8, 5], [6]),  # response 3 was not kept in the prompt: split
        call("c3", 3, [1, 2, 8, 5, 6], [7]),  # extends c2 exactly (no observation tokens)
        call("c4", 4, [1, 2], [9]),  # shorter than the previous prompt: split
        call("c5", 5, [1, 2, 9, 0], [4], version=1),  # other policy version: split
        call("c6", 6, [1, 2, 9, 0, 4], [5], version=1, agent="x"),  # other agent: split
    ]
    r = rollout(calls, reward=0.5)
    assert transitions(r, merge_prefix=True) == [
        tr(0, [1, 2], [3], 0.5, False, ["c1"]),
        tr(1, [1, 2, 8, 5], [6, 7], 0.5, False, ["c2", "c3"], logprobs=[-0.1, -0.1]),
        tr(2, [1, 2], [9], 0.5, False, ["c4"]),
        tr(3, [1, 2, 9, 0], [4], 0.5, False, ["c5"], version=1),
        tr(4, [1, 2, 9, 0, 4], [5], 0.5, True, ["c6"], version=1, agent="x"),
    ]


def test_prefix_merge_discounted_sums_rewards_of_merged_calls() -> None:
    calls = [
        call("c1", 1, [1], [2]),
        call("c2", 3, [1, 2, 3], [4]),
        call("c3", 5, [9], [8]),
    ]
    rewards = [rew(1.0, 2), rew(2.0, 4), rew(3.0, 6, final=True)]
    r = rollout(calls, rewards, reward=3.0)
    out = transitions(r, "discounted", gamma=0.5, merge_prefix=True)
    assert out == [
        tr(0, [1], [2, 3, 4], 4.5, False, ["c1", "c2"], logprobs=[-0.1, 0.0, -0.1], mask=[1, 0, 1]),
        tr(1, [9], [8], 3.0, True, ["c3"]),
    ]


def test_prefix_merge_across_context_calls_of_other_agents() -> None:
    calls = [
        call("s1", 1, [1], [2], agent="solver"),
        call("p1", 2, [1, 2, 5], [6], agent="planner"),
        call("s2", 3, [1, 2, 5, 6, 7], [8], agent="solver"),
    ]
    out = transitions(rollout(calls, reward=1.0), agents=["solver"], merge_prefix=True)
    assert out == [
        tr(
            0,
            [1],
            [2, 5, 6, 7, 8],
            1.0,
            True,
            ["s1", "s2"],
            agent="solver",
            logprobs=[-0.1, 0.0, 0.0, 0.0, -0.1],
            mask=[1, 0, 0, 0, 1],
        )
    ]


# --- refused and skipped calls -----------------------------------------------------------


@pytest.mark.parametrize(
    ("prompt", "response", "logprobs", "field"),
    [
        (None, [1], "auto", "prompt_token_ids"),
        ([1], None, None, "response_token_ids"),
        ([1], [2], None, "response_logprobs"),
    ],
)
def test_missing_token_ids_are_refused(
    prompt: list[int] | None, response: list[int] | None, logprobs: Any, field: str
) -> None:
    r = rollout([call("c1", 1, [0], [0]), call("c-bad", 2, prompt, response, logprobs=logprobs)])
    with pytest.raises(MissingTokenIds) as err:
        transitions(r)
    assert isinstance(err.value, InvalidInput)
    assert RID in str(err.value) and "c-bad" in str(err.value) and field in str(err.value)


def test_logprob_count_mismatch_is_refused() -> None:
    r = rollout([call("c1", 1, [0], [1, 2], logprobs=[-0.5])])
    with pytest.raises(InvalidInput, match="c1: response_logprobs has 1 entries for 2"):
        transitions(r)


def test_failed_cached_and_other_agents_calls_are_skipped_even_without_ids() -> None:
    calls = [
        call("c1", 1, [1], [2], agent="solver"),
        call("bad", 2, [1, 2], None, status="failed", logprobs=None, agent="solver"),
        call("hit", 3, None, None, cached=True, agent="solver"),
        call("other", 4, None, None, agent="critic"),
        call("c2", 5, [3], [4], agent="solver"),
    ]
    r = rollout(calls, [rew(1.0, 2, call_id="bad")], reward=None)
    assert transitions(r, "discounted", agents=["solver"], gamma=1.0) == [
        tr(0, [1], [2], 1.0, False, ["c1"], agent="solver"),
        tr(1, [3], [4], 0.0, True, ["c2"], agent="solver"),
    ]
    with pytest.raises(MissingTokenIds, match="other"):
        transitions(r)


# --- attempts ----------------------------------------------------------------------------


def test_attempt_selection() -> None:
    calls = [
        call("a1", 1, [1], [2], attempt=1),
        call("a2", 2, [3], [4], attempt=1),
        call("b1", 10, [5], [6], attempt=2),
    ]
    r = rollout(calls, [rew(0.5, 3, attempt=1)], reward=1.0, attempts=(1, 2))
    assert transitions(r) == [tr(0, [5], [6], 1.0, True, ["b1"])]
    assert transitions(r, attempt=1) == [
        tr(0, [1], [2], 0.5, False, ["a1"]),
        tr(1, [3], [4], 0.5, True, ["a2"]),
    ]
    with pytest.raises(InvalidInput, match=r"credit.attempt: rollout ro-1 has no attempt 3"):
        transitions(r, attempt=3)


def test_rollout_without_calls_has_no_transitions() -> None:
    r = rollout([], [rew(1.0, 1)], reward=2.0)
    assert transitions(r, "discounted") == []
    assert rollout_return(r, "discounted") == 3.0
    assert rollout_return(r, "final") == 2.0


def test_transitions_batch_concatenates_in_order() -> None:
    a = rollout(three_calls(), reward=1.0)
    b = a.model_copy(update={"id": "ro-2", "reward": 0.0})
    out = transitions_batch([a, b], CreditConfig(merge_prefix=True))
    assert [(t.rollout_id, t.step, t.reward) for t in out] == [
        ("ro-1", 0, 1.0),
        ("ro-1", 1, 1.0),
        ("ro-1", 2, 1.0),
        ("ro-2", 0, 0.0),
        ("ro-2", 1, 0.0),
        ("ro-2", 2, 0.0),
    ]


# --- config ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"mode": "gae"}, "credit.mode"),
        ({"gamma": 1.5}, "credit.gamma"),
        ({"gamma": -0.1}, "credit.gamma"),
        ({"gamma": "0.9"}, "credit.gamma"),
        ({"agents": "solver"}, "credit.agents"),
        ({"agents": []}, "credit.agents"),
        ({"merge_prefix": "yes"}, "credit.merge_prefix"),
        ({"attempt": 0}, "credit.attempt"),
    ],
)
def test_config_validation_names_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidInput, match=field):
        CreditConfig(**kwargs)


def test_config_overrides_and_list_agents() -> None:
    cfg = CreditConfig(agents=["a", "b"])  # type: ignore[arg-type]
    assert cfg.agents == ("a", "b")
    r = rollout(three_calls(), reward=1.0)
    with pytest.raises(InvalidInput, match=r"credit\.gamma"):
        transitions(r, cfg, gamma=2.0)
    with pytest.raises(InvalidInput, match=r"credit\.gama: unknown setting"):
        transitions(r, "discounted", gama=0.9)
    with pytest.raises(InvalidInput, match="credit: expected"):
        transitions(r, 3)  # type: ignore[arg-type]


def test_config_from_dict() -> None:
    cfg = CreditConfig.from_dict({"mode": "discounted", "gamma": 1, "agents": ["a"]})
    assert cfg == CreditConfig("discounted", 1, ("a",))
    with pytest.raises(InvalidInput, match=r"credit\.gama: unknown setting; known: mode, gamma"):
        CreditConfig.from_dict({"gama": 0.9})
