"""Records serialize to JSON losslessly and refuse bad values by field."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from boltrl.records import (
    LLM,
    RECORDS_ADAPTER,
    SCHEMA_VERSION,
    Attempt,
    AttemptOutcome,
    CallAnnotation,
    LLMCall,
    Resources,
    RewardEvent,
    Rollout,
    RolloutStatus,
    Task,
    ToolStep,
    Transition,
)


def _rollout() -> Rollout:
    task = Task(
        id="t1",
        input={"q": "2+2?", "nested": {"x": [1, 2.5, None]}},
        group="g",
        split="train",
        metadata={"run": "r", "step": 3},
    )
    call = LLMCall(
        id="chatcmpl-1",
        rollout_id="ro-1",
        attempt=2,
        agent="writer",
        parent_id="span-0",
        request={"messages": [{"role": "user", "content": "2+2?"}], "temperature": 0.7},
        response={"message": {"role": "assistant", "content": "4"}, "finish_reason": "stop"},
        prompt_token_ids=[1, 2, 3],
        response_token_ids=[4, 5],
        response_logprobs=[-0.1, -1e-9],
        policy_version=7,
        template_hash="abc",
        model="m",
        usage={"prompt_tokens": 3},
        started_at=1.5,
        ended_at=2.25,
        seq=4,
    )
    return Rollout(
        id="ro-1",
        task=task,
        status=RolloutStatus.SUCCEEDED,
        max_attempts=3,
        timeout_s=9.5,
        created_at=1.0,
        finished_at=3.0,
        reward=1.0,
        attempts=[
            Attempt(
                rollout_id="ro-1",
                number=2,
                worker_id="w",
                started_at=1.0,
                lease_expires_at=31.0,
                last_heartbeat=1.0,
                outcome=AttemptOutcome.SUCCEEDED,
                ended_at=3.0,
                task=task,
            )
        ],
        calls=[call],
        tool_steps=[
            ToolStep(
                id="tool-1",
                rollout_id="ro-1",
                attempt=2,
                name="calc",
                arguments={"x": 1},
                result=[1, "two"],
                call_id="chatcmpl-1",
            )
        ],
        rewards=[RewardEvent(id="rew-1", rollout_id="ro-1", attempt=2, value=0.5, seq=5)],
        annotations=[CallAnnotation(id="ann-1", call_id="chatcmpl-1", agent="writer")],
        unjoined_calls=1,
    )


def test_rollout_round_trips_losslessly() -> None:
    r = _rollout()
    assert r.schema_version == SCHEMA_VERSION
    assert Rollout.model_validate_json(r.model_dump_json()) == r


def test_mixed_records_round_trip_by_kind() -> None:
    r = _rollout()
    records = [r.calls[0], r.tool_steps[0], r.rewards[0], r.annotations[0]]
    back = RECORDS_ADAPTER.validate_json(RECORDS_ADAPTER.dump_json(records))
    assert back == records
    assert [type(x) for x in back] == [LLMCall, ToolStep, RewardEvent, CallAnnotation]


def test_other_records_round_trip() -> None:
    t = Transition(
        rollout_id="r",
        task_id="t",
        group="g",
        step=0,
        agent=None,
        state=[1],
        action=[2, 3],
        action_logprobs=[-0.5, 0.0],
        action_mask=[1, 0],
        reward=0.25,
        done=True,
        policy_version=None,
        call_ids=["c"],
    )
    llm = LLM(base_url="http://h/rollouts/r/v1", model="m", temperature=0.0, rollout_id="r")
    res = Resources(gateway_url="http://h", policy_version=3, sampling={"temperature": 0.7})
    for rec in (t, llm, res):
        assert type(rec).model_validate_json(rec.model_dump_json()) == rec
    assert res.llm_for("r9").base_url == "http://h/rollouts/r9/v1"
    assert res.llm_for("r9").temperature == 0.7


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_reward_is_refused_by_name(bad: float) -> None:
    with pytest.raises(ValidationError, match="value"):
        RewardEvent(value=bad)


def test_unknown_fields_are_refused() -> None:
    with pytest.raises(ValidationError, match="colour"):
        Task.model_validate({"input": {}, "colour": "red"})
