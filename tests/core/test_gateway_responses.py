"""The Responses API through the official openai client: text, function calls, streaming."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from gateway_util import (
    WEATHER_TOOL,
    client,
    normalized,
    responses_stream_deltas,
    running,
    scripted_call,
    serve,
    tool_call,
)

from boltrl.gateway import Gateway
from boltrl.store import open_store
from boltrl.store.base import Store
from boltrl.testing import ScriptedBackend

SCRIPT = [
    {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]},
    "It is sunny in Paris.",
]
FLAT_TOOL = {"type": "function", **WEATHER_TOOL["function"]}


@pytest.fixture
def store() -> Iterator[Store]:
    s = open_store("memory://")
    yield s
    s.close()


@pytest.fixture
def gateway(store: Store) -> Iterator[Gateway]:
    with serve(ScriptedBackend(SCRIPT), store) as gw:
        yield gw


def test_function_call_then_text(gateway: Gateway, store: Store) -> None:
    (attempt,) = running(store)
    llm = client(gateway.rollout_url(attempt))
    first = llm.responses.create(
        model="policy",
        instructions="You are helpful.",
        input="Weather in Paris?",
        tools=[FLAT_TOOL],
        temperature=0.2,
        max_output_tokens=50,
        store=False,
        parallel_tool_calls=True,
        metadata={"x": "y"},
        include=[],
    )
    assert first.id.startswith("resp_") and first.status == "completed"
    (fc,) = first.output
    assert fc.type == "function_call"
    assert (fc.call_id, fc.name, json.loads(fc.arguments)) == (
        "call_0_0",
        "get_weather",
        {"city": "Paris"},
    )
    assert first.output_text == "" and first.instructions == "You are helpful."
    assert first.tools[0].name == "get_weather"

    second = llm.responses.create(
        model="policy",
        instructions="You are helpful.",
        input=[
            {"role": "user", "content": "Weather in Paris?"},
            {
                "type": "function_call",
                "call_id": fc.call_id,
                "name": fc.name,
                "arguments": fc.arguments,
                "id": fc.id,
                "status": "completed",
            },
            {"type": "function_call_output", "call_id": fc.call_id, "output": "sunny"},
        ],
        tools=[FLAT_TOOL],
    )
    assert second.output_text == "It is sunny in Paris."
    (msg,) = second.output
    assert msg.type == "message" and msg.role == "assistant" and msg.status == "completed"
    assert second.usage is not None and second.usage.total_tokens > 0

    calls = store.get(attempt.rollout_id).calls
    assert [c.id for c in calls] == [first.id, second.id]
    weather = tool_call("call_0_0", "get_weather", '{"city": "Paris"}')
    system = {"role": "system", "content": "You are helpful."}
    user = {"role": "user", "content": "Weather in Paris?"}
    base = {"api": "responses", "model": "policy", "tools": [WEATHER_TOOL]}
    assert normalized(calls[0]) == scripted_call(
        first.id,
        attempt,
        {**base, "messages": [system, user], "temperature": 0.2, "max_tokens": 50},
        text=None,
        tool_calls=[weather],
        finish_reason="tool_calls",
    )
    history = [
        system,
        user,
        {"role": "assistant", "content": None, "tool_calls": [weather]},
        {"role": "tool", "tool_call_id": "call_0_0", "content": "sunny"},
    ]
    assert normalized(calls[1]) == scripted_call(
        second.id, attempt, {**base, "messages": history}, text="It is sunny in Paris."
    )


def test_message_items_with_parts_and_reasoning_skipped(store: Store) -> None:
    with serve(ScriptedBackend(["ok"]), store) as gw:
        (attempt,) = running(store)
        r = client(gw.rollout_url(attempt)).responses.create(
            model="policy",
            input=[
                {"type": "message", "role": "developer", "content": "rules"},
                {"role": "user", "content": [{"type": "input_text", "text": "a"}]},
                {"type": "reasoning", "id": "rs_1", "summary": []},
                {
                    "type": "message",
                    "role": "assistant",
                    "id": "msg_1",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": "b", "annotations": []}],
                },
                {"role": "user", "content": "c"},
            ],
        )
    assert r.output_text == "ok"
    (call,) = store.get(attempt.rollout_id).calls
    assert call.request["messages"] == [
        {"role": "system", "content": "rules"},
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
    ]


def test_streaming_text(gateway: Gateway, store: Store) -> None:
    (attempt,) = running(store)
    llm = client(gateway.rollout_url(attempt))
    llm.responses.create(model="policy", input="warm up")  # consume the tool call
    with llm.responses.stream(model="policy", input="Weather?") as stream:
        events = list(stream)
        final = stream.get_final_response()
    deltas = responses_stream_deltas(events)
    assert len(deltas) > 1 and "".join(deltas) == "It is sunny in Paris."
    assert final.output_text == "It is sunny in Paris." and final.status == "completed"
    calls = store.get(attempt.rollout_id).calls
    assert calls[-1].id == final.id == events[0].response.id
    assert calls[-1].request["stream"] is True


def test_streaming_function_call(gateway: Gateway, store: Store) -> None:
    (attempt,) = running(store)
    llm = client(gateway.rollout_url(attempt))
    events = list(
        llm.responses.create(model="policy", input="Weather?", stream=True, tools=[FLAT_TOOL])
    )
    kinds = [e.type for e in events]
    assert kinds[2] == "response.output_item.added"
    assert "response.function_call_arguments.delta" in kinds
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert json.loads(done.arguments) == {"city": "Paris"}
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert args == done.arguments
    completed = events[-1]
    assert completed.type == "response.completed"
    (item,) = completed.response.output
    assert (item.type, item.call_id, item.name) == ("function_call", "call_0_0", "get_weather")
    (call,) = store.get(attempt.rollout_id).calls
    assert call.id == completed.response.id
    assert call.response["message"]["tool_calls"][0]["function"]["name"] == "get_weather"


def test_max_output_tokens_gives_incomplete() -> None:
    with serve(ScriptedBackend(["a long answer"])) as gw:
        r = client(f"{gw.url}/v1").responses.create(model="m", input="x", max_output_tokens=3)
    assert r.status == "incomplete" and r.incomplete_details is not None
    assert r.incomplete_details.reason == "max_output_tokens" and r.output_text == "a l"
