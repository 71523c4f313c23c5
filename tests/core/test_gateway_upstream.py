"""UpstreamBackend against real servers: a scripted boltrl gateway as the upstream (it
speaks vLLM's ``return_token_ids``), one that returns no ids, one that rejects the
field, one that is down; and ``boltrl gateway serve`` end to end."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from gateway_util import WEATHER_TOOL, client, normalized, running, scripted_call, serve, tool_call
from starlette.types import ASGIApp, Receive, Scope, Send

from boltrl.errors import BackendError
from boltrl.gateway import Gateway
from boltrl.gateway.upstream import UpstreamBackend
from boltrl.store import open_store
from boltrl.store.base import Store
from boltrl.store.server import serve_in_thread
from boltrl.testing import ScriptedBackend

SCRIPT = [
    {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo"}}]},
    "Snow in Oslo.",
]


@pytest.fixture
def store() -> Iterator[Store]:
    s = open_store("memory://")
    yield s
    s.close()


def test_chained_gateways_record_the_upstream_token_ids(store: Store) -> None:
    with serve(ScriptedBackend(SCRIPT)) as up:
        backend = UpstreamBackend(f"{up.url}/v1", "scripted", policy_version=5)
        with serve(backend, store) as gw:
            (attempt,) = running(store)
            llm = client(gw.rollout_url(attempt))
            messages: list[Any] = [{"role": "user", "content": "Weather in Oslo?"}]
            first = llm.chat.completions.create(
                model="policy", messages=messages, tools=[WEATHER_TOOL], temperature=0.3
            )
            msg = first.choices[0].message
            assert msg.tool_calls is not None
            messages += [
                msg.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": "-3C"},
            ]
            second = llm.chat.completions.create(
                model="policy", messages=messages, tools=[WEATHER_TOOL]
            )
            assert second.choices[0].message.content == "Snow in Oslo."
        asyncio.run(backend.aclose())  # from another loop than the one that used it
    calls = store.get(attempt.rollout_id).calls
    weather = tool_call("call_0_0", "get_weather", '{"city": "Oslo"}')
    base = {"api": "chat.completions", "model": "policy", "tools": [WEATHER_TOOL]}
    expected = [
        scripted_call(
            first.id,
            attempt,
            {**base, "messages": messages[:1], "temperature": 0.3},
            text=None,
            tool_calls=[weather],
            finish_reason="tool_calls",
            policy_version=5,
        ),
        scripted_call(
            second.id,
            attempt,
            {
                **base,
                "messages": [
                    messages[0],
                    {"role": "assistant", "content": None, "tool_calls": [weather]},
                    {"role": "tool", "tool_call_id": "call_0_0", "content": "-3C"},
                ],
            },
            text="Snow in Oslo.",
            policy_version=5,
        ),
    ]
    # The upstream's template is its own business: a chained call carries no template hash.
    assert [normalized(c) for c in calls] == [e | {"template_hash": None} for e in expected]


def _echo(request: Any) -> str:
    r = request
    stop = [[ord(c) for c in s] for s in r.stop]  # spelled out, or it would stop the echo
    return json.dumps([r.temperature, r.top_p, r.max_tokens, stop, r.seed, r.tool_choice])


def test_sampling_parameters_are_forwarded() -> None:
    with serve(ScriptedBackend(_echo)) as up, serve(UpstreamBackend(up.url, "scripted")) as gw:
        r = client(f"{gw.url}/v1").chat.completions.create(
            model="x",
            messages=[{"role": "user", "content": "p"}],
            temperature=0.5,
            top_p=0.8,
            max_tokens=99,
            stop=["@@"],
            seed=3,
            tools=[WEATHER_TOOL],
            tool_choice="required",
        )
    assert json.loads(r.choices[0].message.content or "") == [
        0.5,
        0.8,
        99,
        [[64, 64]],
        3,
        "required",
    ]


def test_upstream_without_token_ids_records_them_missing(store: Store) -> None:
    with serve(ScriptedBackend(["no ids here"], with_token_ids=False)) as up:
        with serve(UpstreamBackend(f"{up.url}/v1", "scripted"), store) as gw:
            (attempt,) = running(store)
            r = client(gw.rollout_url(attempt)).chat.completions.create(
                model="policy", messages=[{"role": "user", "content": "hi"}]
            )
    assert r.choices[0].message.content == "no ids here"
    (call,) = store.get(attempt.rollout_id).calls
    assert call.status == "ok" and not call.has_tokens
    assert (call.prompt_token_ids, call.response_token_ids, call.response_logprobs) == (
        None,
        None,
        None,
    )
    assert call.usage["total_tokens"] > 0  # the upstream's own usage counts are kept


class _StrictOpenAI:
    """Middleware making a boltrl gateway refuse ``return_token_ids`` the way OpenAI's
    own API refuses unknown fields."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.refused = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        body = b""
        while True:
            msg = await receive()
            body += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        if b"return_token_ids" in body:
            self.refused += 1
            message = "Unrecognized request argument supplied: return_token_ids"
            error = json.dumps(
                {
                    "error": {
                        "message": message,
                        "type": "invalid_request_error",
                        "param": None,
                        "code": None,
                    }
                }
            ).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 400,
                    "headers": [(b"content-type", b"application/json")],
                }
            )
            await send({"type": "http.response.body", "body": error})
            return None

        async def replay() -> dict[str, Any]:
            return {"type": "http.request", "body": body, "more_body": False}

        return await self.app(scope, replay, send)


def test_upstream_rejecting_return_token_ids_is_asked_without_it(store: Store) -> None:
    up = Gateway(ScriptedBackend(["fine"]))
    strict = _StrictOpenAI(up.app)
    up.app = strict  # type: ignore[assignment]
    with up, serve(UpstreamBackend(f"{up.url}/v1", "scripted"), store) as gw:
        (attempt,) = running(store)
        llm = client(gw.rollout_url(attempt))
        for _ in range(2):
            r = llm.chat.completions.create(model="p", messages=[{"role": "user", "content": "x"}])
            assert r.choices[0].message.content == "fine"
    assert strict.refused == 1  # asked once with the field, never again
    calls = store.get(attempt.rollout_id).calls
    assert len(calls) == 2 and not any(c.has_tokens for c in calls)


def test_upstream_failures_are_502_503_and_recorded(store: Store) -> None:
    with serve(ScriptedBackend([BackendError("upstream model broke")])) as up:
        with serve(UpstreamBackend(f"{up.url}/v1", "scripted"), store) as gw:
            (attempt,) = running(store)
            r = httpx.post(
                f"{gw.rollout_url(attempt)}/chat/completions",
                json={"model": "p", "messages": [{"role": "user", "content": "x"}]},
            )
            # the upstream answered 502 (bad gateway): transient for us, so 503
            assert r.status_code == 503 and "upstream model broke" in r.text
    with serve(UpstreamBackend("http://127.0.0.1:9/v1", "scripted"), store) as gw:
        r = httpx.post(
            f"{gw.rollout_url(attempt)}/chat/completions",
            json={"model": "p", "messages": [{"role": "user", "content": "x"}]},
        )
        assert r.status_code == 503 and "unreachable" in r.json()["error"]["message"]
    calls = store.get(attempt.rollout_id).calls
    assert [c.status for c in calls] == ["failed", "failed"]
    assert all(c.error and not c.has_tokens for c in calls)


def test_base_url_forms() -> None:
    assert UpstreamBackend("http://h:8000", "m").base_url == "http://h:8000/v1"
    assert UpstreamBackend("http://h:8000/", "m").base_url == "http://h:8000/v1"
    assert UpstreamBackend("http://h:8000/openai/v1/", "m").base_url == "http://h:8000/openai/v1"


def test_cli_gateway_serve_records_into_a_store(tmp_path: Path, store: Store) -> None:
    (attempt,) = running(store)
    log = tmp_path / "stderr.log"
    with (
        serve_in_thread(store) as served,
        serve(ScriptedBackend(["from upstream"])) as up,
        log.open("w") as err,
    ):
        argv = [
            "gateway",
            "serve",
            "--upstream",
            f"{up.url}/v1",
            "--model",
            "scripted",
            "--store",
            served.url,
            "--port",
            "0",
        ]
        proc = subprocess.Popen(
            [sys.executable, "-m", "boltrl.cli", *argv],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert "boltrl gateway serving scripted" in line, line + log.read_text()
            url = line.split(" on ")[1].split()[0]
            r = client(f"{url}{attempt.route}/v1").chat.completions.create(
                model="p", messages=[{"role": "user", "content": "hi"}]
            )
        finally:
            proc.send_signal(signal.SIGTERM)
            out = proc.communicate(timeout=20)[0]
    assert proc.returncode == 0, out + log.read_text()
    assert "boltrl gateway stopped" in out
    (call,) = store.get(attempt.rollout_id).calls
    assert call.id == r.id and call.response["message"]["content"] == "from upstream"
    assert call.prompt_token_ids is not None
