"""Chat Completions through the official openai client: every call recorded, exactly."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from gateway_util import WEATHER_TOOL, client, normalized, running, scripted_call, serve, tool_call

from boltrl.gateway import Gateway
from boltrl.gateway.backend import GenerationRequest
from boltrl.store import open_store
from boltrl.store.base import Store
from boltrl.testing import SCRIPTED_LOGPROB, ScriptedBackend, render_prompt

SCRIPT = [
    "Hello there, traveller.",
    {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]},
    "It is sunny in Paris.",
]


@pytest.fixture
def store() -> Iterator[Store]:
    s = open_store("memory://")
    yield s
    s.close()


@pytest.fixture
def gateway(store: Store) -> Iterator[Gateway]:
    with serve(ScriptedBackend(SCRIPT), store) as gw:
        yield gw


def test_plain_call_is_recorded_whole(gateway: Gateway, store: Store) -> None:
    (attempt,) = running(store)
    llm = client(gateway.rollout_url(attempt))
    messages = [
        {"role": "developer", "content": "Be brief."},
        {
            "role": "user",
            "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "!"}],
        },
    ]
    r = llm.chat.completions.create(
        model="policy",
        messages=messages,
        temperature=0.7,
        top_p=0.9,
        max_tokens=64,
        seed=7,
        stop="\n\n",
        user="u1",
        metadata={"k": "v"},
        parallel_tool_calls=False,
        store=False,
        logprobs=False,
    )
    assert r.id.startswith("chatcmpl-")
    assert r.object == "chat.completion" and r.model == "scripted"
    choice = r.choices[0]
    assert (choice.message.content, choice.finish_reason) == ("Hello there, traveller.", "stop")
    assert choice.message.role == "assistant" and choice.message.tool_calls is None

    request = {
        "api": "chat.completions",
        "model": "policy",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi\n!"},
        ],
        "temperature": 0.7,
        "top_p": 0.9,
        "max_tokens": 64,
        "seed": 7,
        "stop": ["\n\n"],
    }
    (call,) = store.get(attempt.rollout_id).calls
    expected = scripted_call(r.id, attempt, request, text="Hello there, traveller.")
    assert normalized(call) == expected
    assert r.usage is not None and r.usage.model_dump(exclude_none=True) == expected["usage"]


def test_tool_conversation(gateway: Gateway, store: Store) -> None:
    (attempt,) = running(store)
    llm = client(gateway.rollout_url(attempt))
    messages: list = [{"role": "user", "content": "Weather in Paris?"}]
    first = llm.chat.completions.create(model="policy", messages=messages)  # script #1
    assert first.choices[0].message.content == "Hello there, traveller."
    messages.append({"role": "assistant", "content": first.choices[0].message.content})
    messages.append({"role": "user", "content": "And the weather?"})
    second = llm.chat.completions.create(
        model="policy", messages=messages, tools=[WEATHER_TOOL], tool_choice="auto"
    )
    msg = second.choices[0].message
    assert second.choices[0].finish_reason == "tool_calls" and msg.content is None
    assert msg.tool_calls is not None and len(msg.tool_calls) == 1
    tc = msg.tool_calls[0]
    assert (tc.id, tc.type, tc.function.name) == ("call_1_0", "function", "get_weather")
    assert json.loads(tc.function.arguments) == {"city": "Paris"}
    messages.append(msg.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": tc.id, "content": "sunny"})
    third = llm.chat.completions.create(
        model="policy",
        messages=messages,
        tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    assert third.choices[0].message.content == "It is sunny in Paris."

    calls = store.get(attempt.rollout_id).calls
    assert [c.id for c in calls] == [first.id, second.id, third.id]
    weather_call = tool_call("call_1_0", "get_weather", '{"city": "Paris"}')
    req = {"api": "chat.completions", "model": "policy", "tools": [WEATHER_TOOL]}
    history = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Hello there, traveller."},
        {"role": "user", "content": "And the weather?"},
    ]
    assert normalized(calls[1]) == scripted_call(
        second.id,
        attempt,
        {**req, "messages": history, "tool_choice": "auto"},
        text=None,
        tool_calls=[weather_call],
        finish_reason="tool_calls",
    )
    history += [
        {"role": "assistant", "content": None, "tool_calls": [weather_call]},
        {"role": "tool", "content": "sunny", "tool_call_id": "call_1_0"},
    ]
    choice = {"type": "function", "function": {"name": "get_weather"}}
    assert normalized(calls[2]) == scripted_call(
        third.id,
        attempt,
        {**req, "messages": history, "tool_choice": choice},
        text="It is sunny in Paris.",
    )
    # Each prompt extends the previous prompt + response (what prefix merging relies on).
    p1, p2 = calls[1], calls[2]
    assert p1.prompt_token_ids and p1.response_token_ids and p2.prompt_token_ids
    head = p1.prompt_token_ids + p1.response_token_ids
    assert p2.prompt_token_ids[: len(head)] == head


def test_streaming_text(gateway: Gateway, store: Store) -> None:
    (attempt,) = running(store)
    llm = client(gateway.rollout_url(attempt))
    messages = [{"role": "user", "content": "hi"}]
    stream = llm.chat.completions.create(
        model="policy", messages=messages, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    ids = {c.id for c in chunks}
    assert len(ids) == 1 and all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Hello there, traveller."
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 1
    finals = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finals[-1] == "stop" and set(finals[:-1]) == {None}
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert all(c.usage is None for c in chunks[:-1])

    (call,) = store.get(attempt.rollout_id).calls
    request = {"api": "chat.completions", "model": "policy", "messages": messages, "stream": True}
    expected = scripted_call(ids.pop(), attempt, request, text=text)
    assert normalized(call) == expected
    assert chunks[-1].usage.model_dump(exclude_none=True) == expected["usage"]


def test_streaming_tool_calls(store: Store) -> None:
    calls = [
        {"name": "get_weather", "arguments": {"city": "Paris"}},
        {"name": "get_weather", "arguments": {"city": "Rome"}},
    ]
    with serve(ScriptedBackend([{"content": "Checking.", "tool_calls": calls}]), store) as gw:
        (attempt,) = running(store)
        llm = client(gw.rollout_url(attempt))
        messages = [{"role": "user", "content": "weather?"}]
        chunks = list(
            llm.chat.completions.create(
                model="policy", messages=messages, tools=[WEATHER_TOOL], stream=True
            )
        )
    text = ""
    acc: dict[int, dict] = {}
    for c in chunks:
        for d in c.choices[0].delta.tool_calls or []:
            slot = acc.setdefault(d.index, {"id": None, "name": None, "arguments": ""})
            if d.id:
                assert slot["id"] is None and slot["arguments"] == ""  # id and name come first
                slot["id"], slot["name"] = d.id, d.function.name
            slot["arguments"] += d.function.arguments or ""
        text += c.choices[0].delta.content or ""
    assert text == "Checking."
    assert acc == {
        0: {"id": "call_0_0", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        1: {"id": "call_0_1", "name": "get_weather", "arguments": '{"city": "Rome"}'},
    }
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    (call,) = store.get(attempt.rollout_id).calls
    request = {
        "api": "chat.completions",
        "model": "policy",
        "messages": messages,
        "tools": [WEATHER_TOOL],
        "stream": True,
    }
    expected_calls = [tool_call(v["id"], v["name"], v["arguments"]) for v in acc.values()]
    assert normalized(call) == scripted_call(
        chunks[0].id,
        attempt,
        request,
        text="Checking.",
        tool_calls=expected_calls,
        finish_reason="tool_calls",
    )


def test_sse_wire_format(gateway: Gateway) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}
    r = httpx.post(f"{gateway.url}/v1/chat/completions", json=body)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = r.text.split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""]
    assert all(e.startswith("data: {") for e in events[:-2])


def test_unrecorded_route_serves_and_records_nothing(gateway: Gateway, store: Store) -> None:
    (attempt,) = running(store)
    llm = client(f"{gateway.url}/v1")
    r = llm.chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}])
    assert r.choices[0].message.content == "Hello there, traveller."
    assert store.get(attempt.rollout_id).calls == []
    assert [m.id for m in llm.models.list().data] == ["scripted"]
    assert llm.models.retrieve("scripted").owned_by == "boltrl"
    rollout_models = client(gateway.rollout_url(attempt)).models.list()
    assert [m.id for m in rollout_models.data] == ["scripted"]


def test_token_ids_and_logprobs_on_request(gateway: Gateway) -> None:
    messages = [{"role": "user", "content": "hi"}]
    body = {"model": "m", "messages": messages, "logprobs": True, "return_token_ids": True}
    data = httpx.post(f"{gateway.url}/v1/chat/completions", json=body).json()
    prompt = list(render_prompt(GenerationRequest(messages=messages)).encode())
    reply = list(b"Hello there, traveller.")
    assert data["prompt_token_ids"] == prompt
    choice = data["choices"][0]
    assert choice["token_ids"] == reply
    assert choice["logprobs"]["content"] == [
        {"token": f"token_id:{i}", "logprob": SCRIPTED_LOGPROB, "bytes": None, "top_logprobs": []}
        for i in reply
    ]


def test_rollout_routes_without_store_serve_per_rollout_scripts() -> None:
    with serve(ScriptedBackend(["one", "two"])) as gw:
        out = []
        for rid in ("a", "a", "b"):
            llm = client(gw.rollout_url(rid))
            r = llm.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
            out.append(r.choices[0].message.content)
    assert out == ["one", "two", "one"]


def test_token_required_when_set() -> None:
    with serve(ScriptedBackend(["ok"]), token="s3cret") as gw:
        ok = client(f"{gw.url}/v1", api_key="s3cret")
        assert ok.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        bad = httpx.post(
            f"{gw.url}/v1/chat/completions", json={}, headers={"authorization": "Bearer no"}
        )
        assert bad.status_code == 401
        assert bad.json()["error"]["code"] == "invalid_api_key"
        assert httpx.get(f"{gw.url}/health").json()["status"] == "ok"
    with pytest.raises(ValueError, match="token"):
        Gateway(ScriptedBackend(["ok"]), host="0.0.0.0")


def test_stream_carries_token_ids_when_asked(gateway: Gateway) -> None:
    messages = [{"role": "user", "content": "hi"}]
    body = {
        "model": "m",
        "messages": messages,
        "stream": True,
        "return_token_ids": True,
        "max_tokens": 1000,
        "max_completion_tokens": 5,
    }
    r = httpx.post(f"{gateway.url}/v1/chat/completions", json=body)
    chunks = [json.loads(e.removeprefix("data: ")) for e in r.text.split("\n\n")[:-2]]
    prompt = list(render_prompt(GenerationRequest(messages=messages)).encode())
    assert chunks[0]["prompt_token_ids"] == prompt
    # max_completion_tokens wins over max_tokens: 5 bytes, cut for length
    assert chunks[-1]["choices"][0] == {
        "index": 0,
        "delta": {},
        "logprobs": None,
        "finish_reason": "length",
        "token_ids": list(b"Hello"),
    }
    assert "prompt_token_ids" not in chunks[1]


def test_gateway_lifecycle() -> None:
    gw = Gateway(ScriptedBackend(["x"]))
    with pytest.raises(RuntimeError, match="not started"):
        _ = gw.url
    gw.start()
    assert gw.start() is gw  # starting twice is a no-op
    url = gw.url
    assert httpx.get(f"{url}/health").status_code == 200
    gw.stop()
    gw.stop()  # idempotent
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/health")
