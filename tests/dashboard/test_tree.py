"""The trace tree of a rollout: parents from the records, never from timing."""

from __future__ import annotations

from typing import Any

from boltrl.dashboard.tree import Node, build_tree
from boltrl.records import (
    Attempt,
    AttemptOutcome,
    CallAnnotation,
    LLMCall,
    RewardEvent,
    Rollout,
    RolloutStatus,
    Task,
    ToolStep,
)


def call(
    cid: str, seq: int, *, attempt: int = 1, parent: str | None = None, agent: str | None = None
) -> LLMCall:
    return LLMCall(
        id=cid,
        rollout_id="ro",
        attempt=attempt,
        seq=seq,
        parent_id=parent,
        agent=agent,
        started_at=float(seq),
        ended_at=seq + 0.5,
    )


def rollout(**records: Any) -> Rollout:
    attempts = [
        Attempt(
            rollout_id="ro",
            number=n,
            worker_id="w",
            started_at=0.5,
            lease_expires_at=99.0,
            last_heartbeat=0.0,
            outcome=AttemptOutcome.FAILED if n == 1 else AttemptOutcome.SUCCEEDED,
            ended_at=50.0,
        )
        for n in (1, 2)
    ]
    return Rollout(
        id="ro",
        task=Task(id="t", input={}),
        status=RolloutStatus.SUCCEEDED,
        attempts=attempts,
        **records,
    )


def shape(n: Node) -> Any:
    return (n.id, [shape(c) for c in n.children]) if n.children else n.id


def test_parents_by_call_id_span_alias_and_framework_span() -> None:
    r = rollout(
        calls=[
            call("c1", 1, parent="graph", agent="planner"),
            call("c2", 3, parent="sp-1", agent="worker"),  # names c1 by its framework span id
            call("c3", 6, parent="c1"),
        ],
        annotations=[
            CallAnnotation(id="a1", rollout_id="ro", attempt=1, call_id="c1", span_id="sp-1")
        ],
        tool_steps=[
            ToolStep(id="t1", rollout_id="ro", attempt=1, seq=4, name="x", call_id="c2"),
            ToolStep(id="t2", rollout_id="ro", attempt=1, seq=5, name="y", parent_id="elsewhere"),
        ],
        rewards=[
            RewardEvent(id="r1", rollout_id="ro", attempt=1, seq=7, value=1.0, call_id="c2"),
            RewardEvent(id="r2", rollout_id="ro", attempt=1, seq=2, value=0.5),
            RewardEvent(id="r3", rollout_id="ro", attempt=1, seq=8, value=0.5, call_id="gone"),
        ],
    )
    one, two = build_tree(r)
    assert shape(one) == (
        "attempt:1",
        [
            ("span:1:graph", [("c1", [("c2", ["t1", "r1"]), "c3"])]),
            "r2",
            ("span:1:elsewhere", ["t2"]),
            "r3",
        ],
    )
    assert shape(two) == "attempt:2"
    span = one.children[0]
    assert (span.kind, span.agent, span.start, span.end, span.seq) == (
        "span",
        "planner",
        1.0,
        6.5,
        1,
    )
    assert (one.start, one.end) == (0.5, 50.0)


def test_cycles_and_other_attempts_fall_back_to_the_attempt() -> None:
    r = rollout(
        calls=[
            call("a", 1, parent="b"),
            call("b", 2, parent="a"),
            call("self", 3, parent="self"),
            call("late", 4, attempt=2, parent="a"),
        ]
    )
    one, two = build_tree(r)
    ids = {n.id for n in one.walk()}
    assert ids == {"attempt:1", "a", "b", "self"}
    assert shape(two) == ("attempt:2", ["late"])
    assert all(n.parent is not None for n in one.walk()[1:])


def test_records_without_attempts_still_get_a_root() -> None:
    r = Rollout(
        id="ro",
        task=Task(id="t", input={}),
        status=RolloutStatus.RUNNING,
        calls=[call("c", 1, attempt=3)],
    )
    [root] = build_tree(r)
    assert shape(root) == ("attempt:3", ["c"])
