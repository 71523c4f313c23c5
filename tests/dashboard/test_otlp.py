"""OpenTelemetry export against a local OTLP/HTTP receiver: span names, parent links,
GenAI attributes, rewards as events, errors; the CLI and the live follower."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dashboard_fill import XSS, run_real
from otlp_receiver import Receiver, Span, start

from boltrl import Task
from boltrl.cli import main
from boltrl.dashboard import source_for
from boltrl.export import MissingExtra, OtlpExporter, OtlpFollower, traces_endpoint
from boltrl.records import Rollout
from boltrl.store import open_store

UNSET, OK, ERROR = 0, 1, 2
INTERNAL, CLIENT = 1, 3


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    rec, server = start()
    yield rec
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, list[Rollout]]]:
    """A SQLite store with one real multi-agent rollout and one failed one."""
    path = tmp_path_factory.mktemp("otlp") / "store.db"
    store = open_store(f"sqlite:///{path}")
    try:
        [real] = run_real(store, 1)
        store.enqueue([Task(id="bad", input={}, metadata={"run": "r", "step": 0})])
        att = store.claim("w-1")
        assert att is not None
        store.finish(
            att,
            "failed",
            error="Traceback (most recent call last):\nKeyError: 'x'",
            error_kind="exception",
        )
        rollouts = [store.get(real), store.get(att.rollout_id)]
    finally:
        store.close()
    return path, rollouts


def by_name(spans: list[Span]) -> dict[str, list[Span]]:
    out: dict[str, list[Span]] = {}
    for s in spans:
        out.setdefault(s.name, []).append(s)
    return out


def test_cli_exports_rollouts_as_genai_traces(db: Any, receiver: Receiver) -> None:
    path, (real, _) = db
    assert main(["export", "--store", f"sqlite:///{path}", "--otlp", receiver.url]) == 0
    traces = receiver.traces()
    assert len(traces) == 2
    [spans] = [t for t in traces.values() if any(s.name == "execute_tool calculator" for s in t)]
    names = by_name(spans)
    assert sorted(names) == [
        "attempt 1",
        "chat scripted",
        "execute_tool calculator",
        "invoke_agent critic",
        "invoke_agent planner",
        "invoke_agent solver",
        "rollout",
    ]
    assert len(names["chat scripted"]) == 4
    ids = {s.span_id: s for s in spans}
    [root] = names["rollout"]
    [attempt] = names["attempt 1"]
    assert root.parent_id == "" and attempt.parent_id == root.span_id
    assert root.attributes["boltrl.rollout.id"] == real.id
    assert root.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert root.attributes["boltrl.rollout.reward"] == 1.0
    assert root.resource["service.name"] == "boltrl" and root.scope == "boltrl"
    for agent in ("planner", "solver", "critic"):
        [turn] = names[f"invoke_agent {agent}"]
        assert turn.parent_id == attempt.span_id
        assert turn.attributes["gen_ai.agent.name"] == agent
    plan, ask, answer, critique = sorted(names["chat scripted"], key=lambda s: s.start)
    calls = real.calls
    assert [ids[s.parent_id].name for s in (plan, ask, answer, critique)] == [
        "invoke_agent planner",
        "invoke_agent solver",
        "invoke_agent solver",
        "invoke_agent critic",
    ]
    c = calls[1]
    assert ask.kind == CLIENT and ask.status == UNSET
    assert ask.start == int(c.started_at * 1e9) and ask.end == int(c.ended_at * 1e9)
    attrs = ask.attributes
    msgs = json.loads(attrs.pop("gen_ai.input.messages"))
    out = json.loads(attrs.pop("gen_ai.output.messages"))
    tools = json.loads(attrs.pop("gen_ai.tool.definitions"))
    assert attrs == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "boltrl",
        "gen_ai.system": "boltrl",
        "gen_ai.request.model": "scripted",
        "gen_ai.response.model": "scripted",
        "gen_ai.response.id": c.id,
        "gen_ai.conversation.id": real.id,
        "gen_ai.agent.name": "solver",
        "gen_ai.usage.input_tokens": c.usage["prompt_tokens"],
        "gen_ai.usage.output_tokens": c.usage["completion_tokens"],
        "gen_ai.response.finish_reasons": ["tool_calls"],
        "boltrl.call.attempt": 1,
        "boltrl.call.cached": False,
        "boltrl.policy_version": 0,
        "boltrl.template_hash": c.template_hash,
    }
    assert msgs == [
        {"role": "system", "parts": [{"type": "text", "content": "You solve."}]},
        {"role": "user", "parts": [{"type": "text", "content": "What is 2+2? (#0)"}]},
    ]
    assert out == [
        {
            "role": "assistant",
            "parts": [
                {
                    "type": "tool_call",
                    "id": "call_1_0",
                    "name": "calculator",
                    "arguments": {"expr": "2+2"},
                }
            ],
            "finish_reason": "tool_calls",
        }
    ]
    assert tools[0]["function"]["name"] == "calculator"
    assert ask.events == [
        (
            "boltrl.reward",
            {
                "boltrl.reward.name": "tool_ok",
                "boltrl.reward.value": 0.25,
                "boltrl.reward.final": False,
                "boltrl.reward.call_id": c.id,
            },
        )
    ]
    [tool] = names["execute_tool calculator"]
    assert tool.parent_id == ask.span_id and tool.kind == INTERNAL
    assert tool.attributes == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "calculator",
        "gen_ai.tool.type": "function",
        "gen_ai.tool.call.id": "call_1_0",
        "gen_ai.agent.name": "solver",
        "boltrl.tool.call_id": c.id,
        "gen_ai.tool.call.arguments": '{"expr": "2+2"}',
        "gen_ai.tool.call.result": '{"value": 4}',
    }
    answer_out = json.loads(answer.attributes["gen_ai.output.messages"])
    assert answer_out[0]["parts"][0]["content"] == f"The answer is 4. {XSS}"


def test_failed_rollout_is_an_error_with_the_traceback(db: Any, receiver: Receiver) -> None:
    path, _ = db
    code = main(
        ["export", "--store", f"sqlite:///{path}", "--otlp", receiver.url, "--status", "failed"]
    )
    assert code == 0
    names = by_name(receiver.spans)
    assert sorted(names) == ["attempt 1", "rollout"]
    [root], [attempt] = names["rollout"], names["attempt 1"]
    assert (root.status, root.attributes["boltrl.run"], root.attributes["boltrl.step"]) == (
        ERROR,
        "r",
        0,
    )
    assert attempt.status == ERROR and attempt.attributes["error.type"] == "exception"
    [(event, attrs)] = attempt.events
    assert event == "exception" and attrs["exception.message"] == "KeyError: 'x'"
    assert attrs["exception.stacktrace"].startswith("Traceback")


def test_ids_are_stable_and_content_can_be_left_out(db: Any, receiver: Receiver) -> None:
    _, (real, _) = db
    exporter = OtlpExporter(receiver.url, content=False, service_name="svc")
    try:
        assert exporter.export([real]) == exporter.export([real]) == 10
    finally:
        exporter.close()
    first, second = receiver.spans[:10], receiver.spans[10:]
    assert [(s.trace_id, s.span_id, s.parent_id) for s in first] == [
        (s.trace_id, s.span_id, s.parent_id) for s in second
    ]
    for s in first:
        assert s.resource["service.name"] == "svc"
        assert not {
            "gen_ai.input.messages",
            "gen_ai.output.messages",
            "gen_ai.tool.call.arguments",
            "gen_ai.tool.call.result",
        } & set(s.attributes)


def test_follower_exports_each_rollout_as_it_finishes(receiver: Receiver) -> None:
    store = open_store("memory://")
    store.enqueue([Task(id="before", input={})])
    att = store.claim("w")
    assert att is not None
    store.finish(att, "succeeded", reward=0.0)  # finished before: not exported
    follower = OtlpFollower(source_for(store), receiver.url, poll_s=0.05).start()
    try:
        [rid] = store.enqueue([Task(id="later", input={}, metadata={"run": "live"})])
        att = store.claim("w")
        assert att is not None
        time.sleep(0.2)
        assert receiver.spans == []  # running: not yet
        store.finish(att, "succeeded", reward=1.0)
        deadline = time.monotonic() + 10
        while not receiver.spans and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        follower.stop()
        store.close()
    assert [
        s.attributes.get("boltrl.rollout.id") for s in receiver.spans if s.name == "rollout"
    ] == [rid]
    assert follower.exported == 1


def test_refused_export_is_a_clear_error(db: Any, receiver: Receiver, capsys: Any) -> None:
    path, _ = db
    receiver.refuse = True
    assert main(["export", "--store", f"sqlite:///{path}", "--otlp", receiver.url]) == 1
    out = capsys.readouterr()
    assert "0 rollouts sent" in out.out
    assert "2 rollouts not sent" in out.err and "did not accept" in out.err


def test_missing_extra_says_what_to_install(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter", None)
    with pytest.raises(MissingExtra, match=r"pip install 'boltrl\[otel\]'"):
        OtlpExporter("http://127.0.0.1:1")
    assert main(["export", "--store", "memory://", "--otlp", "http://127.0.0.1:1"]) == 1
    assert "boltrl[otel]" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("http://h:4318", "http://h:4318/v1/traces"),
        ("http://h:4318/", "http://h:4318/v1/traces"),
        ("https://h/api/public/otel/v1/traces", "https://h/api/public/otel/v1/traces"),
    ],
)
def test_traces_endpoint(given: str, expected: str) -> None:
    assert traces_endpoint(given) == expected


def test_store_serve_exports_live(receiver: Receiver) -> None:
    import subprocess

    from boltrl.store import HttpStore

    proc = subprocess.Popen(
        [sys.executable, "-m", "boltrl.cli", "store", "serve", "--db", "memory://",
         "--port", "0", "--otlp", receiver.url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().split(" on ")[1].split()[0]
        with HttpStore(url) as store:
            [rid] = store.enqueue([Task(id="served", input={})])
            att = store.claim("w")
            assert att is not None
            store.finish(att, "succeeded", reward=1.0)
            deadline = time.monotonic() + 10
            while not receiver.spans and time.monotonic() < deadline:
                time.sleep(0.05)
        [root] = [s for s in receiver.spans if s.name == "rollout"]
        assert root.attributes["boltrl.rollout.id"] == rid
    finally:
        proc.terminate()
        proc.wait(10)
