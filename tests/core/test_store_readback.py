"""Property: every write a store accepts can be read back, exported and the rollout
finished; every write it refuses is an ``InvalidInput`` that changed nothing. Memory,
SQLite and HTTP stores, with hypothesis generating JSON values that include what does
not read back (NaN, ±inf, integers beyond int64, lone surrogates, deep nesting)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from boltrl.errors import InvalidInput
from boltrl.export import rollout_spans, write_transitions
from boltrl.records import LLMCall, Task, ToolStep
from boltrl.store import HttpStore, MemoryStore, SqliteStore
from boltrl.store.base import Store
from boltrl.store.server import serve_in_thread

pytestmark = pytest.mark.timeout(300)

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),  # some beyond int64
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),  # includes lone surrogates
)


def _deep(n: int) -> Any:
    value: Any = 1
    for _ in range(n):
        value = [value]
    return value


_values = st.one_of(
    st.recursive(
        _scalars,
        lambda inner: (
            st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4)
        ),
        max_leaves=12,
    ),
    st.integers(min_value=50, max_value=80).map(_deep),  # around the depth limit
)


def _same(a: Any, b: Any) -> bool:
    """Equal as JSON: what was accepted reads back unchanged (floats exactly, -0.0 too)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


@pytest.fixture(scope="module", params=["memory", "sqlite", "http"])
def store(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Store]:
    if request.param == "memory":
        with MemoryStore() as s:
            yield s
    elif request.param == "sqlite":
        with SqliteStore(tmp_path_factory.mktemp("readback") / "s.db") as s:
            yield s
    else:
        with MemoryStore() as backing, serve_in_thread(backing) as srv, HttpStore(srv.url) as s:
            yield s


def _try(fn: Any) -> bool:
    try:
        fn()
    except InvalidInput:
        return False
    return True


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(task_input=_values, request_value=_values, tool_result=_values)
@example(task_input=math.nan, request_value=[math.inf], tool_result={"x": -math.inf})
@example(task_input=2**64, request_value="\ud800", tool_result=_deep(70))
@example(task_input=_deep(63), request_value=_deep(62), tool_result=2**63 - 1)
def test_accepted_writes_read_back_export_and_finish(
    store: Store, tmp_path: Path, task_input: Any, request_value: Any, tool_result: Any
) -> None:
    before = store.count()
    task = Task(input={"v": task_input})
    if not _try(lambda: store.enqueue([task])):
        assert store.count() == before  # refused: nothing enqueued
        task = Task(input={"v": "plain"})
        store.enqueue([task])
    attempt = store.claim("prop", lease_s=600)
    assert attempt is not None and attempt.task is not None
    assert _same(attempt.task.input, task.input)
    rid = attempt.rollout_id
    call = LLMCall(
        id=f"{rid}-c",
        rollout_id=rid,
        attempt=attempt.number,
        request={"messages": [{"role": "user", "content": "q"}], "extra": request_value},
        prompt_token_ids=[1, 2, 3],
        response_token_ids=[4, 5],
        response_logprobs=[-0.5, -1.5],
    )
    step = ToolStep(
        id=f"{rid}-t", rollout_id=rid, attempt=attempt.number, name="tool", result=tool_result
    )
    kept: list[Any] = []
    for record in (call, step):
        if _try(lambda record=record: store.record(attempt, [record])):
            kept.append(record)
    done = store.finish(attempt, "succeeded", reward=1.0)
    assert done.status == "succeeded"
    back = store.get(rid)
    assert _same(back.task.input, task.input)
    assert [c.id for c in back.calls] == [r.id for r in kept if isinstance(r, LLMCall)]
    if back.calls:
        assert _same(back.calls[0].request, call.request)
    if any(isinstance(r, ToolStep) for r in kept):
        assert _same(back.tool_steps[0].result, tool_result)
    counts = write_transitions([back], tmp_path / "t.jsonl")
    assert counts.transitions == len(back.calls)
    assert rollout_spans(back)  # the OpenTelemetry export reads it too
    assert math.isfinite(done.reward or 0.0)
