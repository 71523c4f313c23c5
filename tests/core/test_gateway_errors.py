"""Every bad input gets the right status and an OpenAI-style body, and changes nothing."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from gateway_util import client, normalized, running, serve

from boltrl.errors import BackendError, BackendUnavailable, StoreUnavailable
from boltrl.gateway import Gateway
from boltrl.records import LLMCall, RolloutStatus, Task
from boltrl.store import MemoryStore, open_store
from boltrl.store.base import Store
from boltrl.testing import ScriptedBackend

MSG = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


def chat(**kw: Any) -> dict[str, Any]:
    return {"model": "m", "messages": MSG, **kw}


def resp(**kw: Any) -> dict[str, Any]:
    return {"model": "m", "input": "hi", **kw}


CHAT_CASES: list[tuple[Any, str | None]] = [
    ({"model": "m"}, "messages"),
    (chat(messages="hi"), "messages"),
    (chat(messages=[]), "messages"),
    (chat(messages=["hi"]), "messages[0]"),
    (chat(messages=[{"role": "robot", "content": "x"}]), "messages[0].role"),
    (chat(messages=[{"role": "user"}]), "messages[0].content"),
    (chat(messages=[{"role": "user", "content": 3}]), "messages[0].content"),
    (
        chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
        "messages[0].content[0].type",
    ),
    (
        chat(messages=[{"role": "user", "content": [{"type": "text", "text": 1}]}]),
        "messages[0].content[0].text",
    ),
    (
        chat(messages=[*MSG, {"role": "assistant", "tool_calls": [{**CALL, "type": "x"}]}]),
        "messages[1].tool_calls[0].type",
    ),
    (
        chat(messages=[*MSG, {"role": "assistant", "tool_calls": [{"function": {"name": "f"}}]}]),
        "messages[1].tool_calls[0].id",
    ),
    (
        chat(messages=[*MSG, {"role": "assistant", "tool_calls": [{**CALL, "function": {}}]}]),
        "messages[1].tool_calls[0].function.name",
    ),
    (chat(messages=[*MSG, {"role": "tool", "content": "r"}]), "messages[1].tool_call_id"),
    (chat(messages=[{"role": "user", "content": "x", "name": 5}]), "messages[0].name"),
    (chat(tools={"f": 1}), "tools"),
    (chat(tools=[{"type": "retrieval"}]), "tools[0].type"),
    (chat(tools=[{"type": "function"}]), "tools[0].function"),
    (chat(tools=[{"type": "function", "function": {"name": ""}}]), "tools[0].function.name"),
    (
        chat(tools=[{"type": "function", "function": {"name": "f", "parameters": "x"}}]),
        "tools[0].function.parameters",
    ),
    (chat(tool_choice="sometimes"), "tool_choice"),
    (chat(tool_choice="required"), "tool_choice"),
    (
        chat(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "g"}}),
        "tool_choice.function.name",
    ),
    (chat(temperature="hot"), "temperature"),
    (chat(temperature=2.5), "temperature"),
    (chat(top_p=True), "top_p"),
    (chat(max_tokens=0), "max_tokens"),
    (chat(max_tokens=1.5), "max_tokens"),
    (chat(max_completion_tokens="9"), "max_completion_tokens"),
    (chat(n=2), "n"),
    (chat(stop=7), "stop"),
    (chat(stop=["a", 1]), "stop[1]"),
    (chat(seed="s"), "seed"),
    (chat(stream="yes"), "stream"),
    (chat(stream=True, stream_options={"include_usage": "y"}), "stream_options.include_usage"),
    (chat(stream_options=[]), "stream_options"),
    (chat(presence_penalty=0.5), "presence_penalty"),
    (chat(frequency_penalty="x"), "frequency_penalty"),
    (chat(logit_bias={"1": 5}), "logit_bias"),
    (chat(functions=[{"name": "f"}]), "functions"),
    (chat(model=5), "model"),
]

RESPONSES_CASES: list[tuple[Any, str | None]] = [
    ({"model": "m"}, "input"),
    (resp(input=5), "input"),
    (resp(input=[]), "input"),
    (resp(input=[{"type": "item_reference", "id": "x"}]), "input[0].type"),
    (resp(input=[{"role": "wizard", "content": "x"}]), "input[0].role"),
    (
        resp(input=[{"role": "user", "content": [{"type": "input_image"}]}]),
        "input[0].content[0].type",
    ),
    (resp(input=[{"type": "function_call", "name": "f", "arguments": "{}"}]), "input[0].call_id"),
    (
        resp(input=[{"type": "function_call", "call_id": "c", "name": "f", "arguments": {}}]),
        "input[0].arguments",
    ),
    (resp(input=[{"type": "function_call_output", "call_id": "c"}]), "input[0].output"),
    (resp(tools=[{"type": "web_search"}]), "tools[0].type"),
    (resp(tools=[{"type": "function"}]), "tools[0].name"),
    (
        resp(
            tools=[{"type": "function", "name": "f"}], tool_choice={"type": "function", "name": "g"}
        ),
        "tool_choice.name",
    ),
    (resp(previous_response_id="resp_1"), "previous_response_id"),
    (resp(conversation="conv_1"), "conversation"),
    (resp(background=True), "background"),
    (resp(instructions=5), "instructions"),
    (resp(max_output_tokens=0), "max_output_tokens"),
    (resp(temperature=-1), "temperature"),
    (resp(metadata="m"), "metadata"),
]

RAW_CASES: list[tuple[bytes, str]] = [
    (b"{not json", "not valid JSON"),
    (b"[1, 2]", "must be a JSON object"),
    (b"", "not valid JSON"),
]


@pytest.fixture(scope="module")
def backend() -> ScriptedBackend:
    return ScriptedBackend(["ok"])


@pytest.fixture(scope="module")
def store() -> Iterator[Store]:
    s = open_store("memory://")
    yield s
    s.close()


@pytest.fixture(scope="module")
def gateway(backend: ScriptedBackend, store: Store) -> Iterator[Gateway]:
    with serve(backend, store) as gw:
        yield gw


@pytest.fixture(scope="module")
def rollout_id(store: Store) -> str:
    return running(store)[0].rollout_id


def _post_unchanged(
    gateway: Gateway, store: Store, backend: ScriptedBackend, rid: str, path: str, **kw: Any
) -> httpx.Response:
    before, calls = store.get(rid), backend.calls
    r = httpx.post(f"{gateway.rollout_url(rid)}/{path}", **kw)
    assert store.get(rid) == before and backend.calls == calls
    return r


@pytest.mark.parametrize(
    "path, body, param",
    [("chat/completions", b, p) for b, p in CHAT_CASES]
    + [("responses", b, p) for b, p in RESPONSES_CASES],
)
def test_malformed_body_is_400_naming_the_field(
    gateway: Gateway,
    store: Store,
    backend: ScriptedBackend,
    rollout_id: str,
    path: str,
    body: Any,
    param: str,
) -> None:
    r = _post_unchanged(gateway, store, backend, rollout_id, path, json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert f"'{param}'" in error["message"]


@pytest.mark.parametrize("raw, message", RAW_CASES)
def test_unparseable_body_is_400(
    gateway: Gateway,
    store: Store,
    backend: ScriptedBackend,
    rollout_id: str,
    raw: bytes,
    message: str,
) -> None:
    for path in ("chat/completions", "responses"):
        headers = {"content-type": "application/json"}  # a JSON body, just not parseable
        r = _post_unchanged(gateway, store, backend, rollout_id, path, content=raw, headers=headers)
        assert r.status_code == 400
        error = r.json()["error"]
        assert message in error["message"] and error["param"] is None


def test_official_client_raises_bad_request(gateway: Gateway, rollout_id: str) -> None:
    import openai

    with pytest.raises(openai.BadRequestError) as e:
        client(gateway.rollout_url(rollout_id)).chat.completions.create(
            model="m", messages=MSG, n=3
        )
    assert e.value.status_code == 400 and e.value.param == "n"


def test_unknown_and_finished_rollouts_are_404(
    gateway: Gateway, store: Store, backend: ScriptedBackend
) -> None:
    queued = store.enqueue([Task(input={})])[0]
    (done,) = running(store)
    store.finish(done, RolloutStatus.SUCCEEDED, reward=1.0)
    cases = [
        ("ro-nope", "rollout_not_found"),
        (queued, "rollout_not_running"),
        (done.rollout_id, "rollout_not_running"),
    ]
    for rid, code in cases:
        before = store.get(rid) if rid != "ro-nope" else None
        for path, body in (("chat/completions", chat()), ("responses", resp())):
            r = httpx.post(f"{gateway.rollout_url(rid)}/{path}", json=body)
            assert r.status_code == 404, r.text
            error = r.json()["error"]
            assert error["code"] == code and rid in error["message"]
            assert error["type"] == "invalid_request_error"
        if before is not None:
            assert store.get(rid) == before


def test_unknown_path_and_method_are_openai_errors(gateway: Gateway) -> None:
    r = httpx.post(f"{gateway.url}/v1/completions", json={})
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    r = httpx.get(f"{gateway.url}/v1/chat/completions")
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"
    r = httpx.get(f"{gateway.url}/v1/models/other")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


@pytest.mark.parametrize(
    "failure, status, code",
    [
        (BackendError("model crashed"), 502, "backend_error"),
        (BackendUnavailable("overloaded"), 503, "backend_unavailable"),
        (RuntimeError("bug"), 502, "backend_error"),
    ],
)
def test_backend_failure_is_recorded_as_failed_call(
    failure: Exception, status: int, code: str
) -> None:
    store = open_store("memory://")
    with serve(ScriptedBackend([failure, "recovered"]), store) as gw:
        (attempt,) = running(store)
        url = f"{gw.rollout_url(attempt)}/chat/completions"
        r = httpx.post(url, json=chat())
        assert r.status_code == status
        error = r.json()["error"]
        assert error["code"] == code and error["type"] == "server_error"
        assert str(failure) in error["message"]
        ok = httpx.post(url, json=chat())
        assert ok.status_code == 200
    failed, served = store.get(attempt.rollout_id).calls
    assert failed.id.startswith("chatcmpl-") and served.id == ok.json()["id"]
    request = {"api": "chat.completions", "model": "m", "messages": MSG}
    assert (
        normalized(failed)
        == LLMCall(
            id=failed.id,
            rollout_id=attempt.rollout_id,
            attempt=1,
            request=request,
            status="failed",
            error=f"{type(failure).__name__}: {failure}",
            model="scripted",
        ).model_dump()
    )
    assert not failed.has_tokens
    store.close()


class _RefusingStore(MemoryStore):
    """A real memory store whose ``record`` is down (to see what the agent is told)."""

    def record(self, attempt: Any, records: Any) -> None:
        raise StoreUnavailable("store is down")


def test_store_failure_fails_the_call_not_silently() -> None:
    store = _RefusingStore()
    with serve(ScriptedBackend(["ok"]), store) as gw:
        (attempt,) = running(store)
        r = httpx.post(f"{gw.rollout_url(attempt)}/chat/completions", json=chat())
    assert r.status_code == 503 and r.json()["error"]["code"] == "store_unavailable"
    assert store.get(attempt.rollout_id).calls == []
