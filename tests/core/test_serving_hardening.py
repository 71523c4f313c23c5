"""Local servers closed to web pages, and only what reads back accepted (issue 15 items
3-4): Host allow-list, JSON content type on state-changing routes, empty tokens refused,
body and value limits, a backend's -inf logprob, --store-token where a store is named."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from gateway_util import client, running, serve

from boltrl.cli import main
from boltrl.dashboard import create_dashboard_app
from boltrl.errors import InvalidInput
from boltrl.gateway import Gateway
from boltrl.gateway.backend import Generation, GenerationRequest
from boltrl.records import LLMCall, Resources, Task
from boltrl.store import HttpStore, MemoryStore, SqliteStore, open_store
from boltrl.store.base import Store
from boltrl.store.server import RunningServer, create_store_app, serve_in_thread
from boltrl.testing import ScriptedBackend

pytestmark = pytest.mark.timeout(60)
JSON_TYPE = {"content-type": "application/json"}


class _Logprobs:
    """A backend whose answer carries the given logprobs (as a model server might)."""

    model_name = "lp"
    policy_version = 0

    def __init__(self, logprobs: list[float]) -> None:
        self.logprobs = logprobs

    async def generate(self, request: GenerationRequest) -> Generation:
        n = len(self.logprobs)
        return Generation(
            text="x" * n,
            prompt_token_ids=[1, 2],
            response_token_ids=list(range(n)),
            response_logprobs=self.logprobs,
        )

    async def aclose(self) -> None:
        pass


@pytest.fixture
def store() -> Iterator[Store]:
    s = MemoryStore()
    yield s
    s.close()


def _chat(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}


# -- closed to web pages -------------------------------------------------------------------


def test_a_page_on_another_name_cannot_drive_the_store(store: Store) -> None:
    before = store.resources()
    evil = {"Host": "rebound.example:4747", **JSON_TYPE}
    body = Resources(gateway_url="http://evil.example/v1").model_dump_json()
    with serve_in_thread(store) as srv:
        r = httpx.post(f"{srv.url}/store/resources", content=body, headers=evil)
        assert r.status_code == 400 and r.json()["error"]["code"] == "bad_host"
        assert "rebound.example" in r.json()["error"]["message"]
        # a cross-site "simple" POST (text/plain, no preflight) from a page on this host
        plain = {"content-type": "text/plain"}
        r = httpx.post(f"{srv.url}/store/resources", content=body, headers=plain)
        assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type"
        r = httpx.post(f"{srv.url}/store/rollouts", content=b'{"tasks":[{"input":{}}]}')
        assert r.status_code == 415  # no content type at all
        assert httpx.get(f"{srv.url}/store/count").json() == {"count": 0}  # same host: served
        assert httpx.get(f"http://localhost:{srv.url.rsplit(':', 1)[1]}/healthz").status_code == 200
    assert store.resources() == before and store.count() == 0


def test_a_page_on_another_name_cannot_use_the_gateway(store: Store) -> None:
    (attempt,) = running(store)
    with serve(ScriptedBackend(["ok"]), store) as gw:
        url = f"{gw.rollout_url(attempt)}/chat/completions"
        r = httpx.post(url, json=_chat(), headers={"Host": "rebound.example"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "bad_host"
        plain = {"content-type": "text/plain"}
        r = httpx.post(url, content=json.dumps(_chat()), headers=plain)
        assert r.status_code == 415 and r.json()["error"]["type"] == "invalid_request_error"
        assert store.get(attempt.rollout_id).calls == []
        assert client(gw.rollout_url(attempt)).chat.completions.create(**_chat()).id
    assert len(store.get(attempt.rollout_id).calls) == 1


def test_the_dashboard_without_a_token_answers_only_local_names(store: Store) -> None:
    from boltrl._serving import local_hosts

    app = create_dashboard_app(store, allowed_hosts=local_hosts("127.0.0.1"), poll_s=0.1)
    server = RunningServer(app)
    try:
        assert httpx.get(f"{server.url}/api/runs").status_code == 200
        r = httpx.get(f"{server.url}/api/runs", headers={"Host": "rebound.example"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "bad_host"
    finally:
        app.state.dashboard.close()
        server.stop()


def test_empty_tokens_are_refused_everywhere(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], store: Store
) -> None:
    for blank in ("", "  "):
        with pytest.raises(InvalidInput, match="empty token"):
            create_store_app(store, token=blank)
        with pytest.raises(InvalidInput, match="empty token"):
            serve_in_thread(store, token=blank)
        with pytest.raises(InvalidInput, match="empty token"):
            Gateway(ScriptedBackend(["ok"]), token=blank)
        with pytest.raises(InvalidInput, match="empty token"):
            create_dashboard_app(store, token=blank)
        with pytest.raises(InvalidInput, match="empty token"):
            HttpStore("http://127.0.0.1:9", token=blank)
    db = tmp_path / "x.db"
    assert main(["store", "serve", "--db", str(db), "--token", ""]) == 2
    assert "empty token" in capsys.readouterr().err and not db.exists()
    assert main(["dashboard", "--store", "memory://", "--token", ""]) == 2
    assert "empty token" in capsys.readouterr().err
    argv = ["gateway", "serve", "--upstream", "http://127.0.0.1:9/v1", "--model", "m"]
    assert main([*argv, "--token", ""]) == 2
    assert "empty token" in capsys.readouterr().out


# -- only what reads back ------------------------------------------------------------------


def test_over_size_bodies_get_413_before_anything_is_written(store: Store) -> None:
    with serve_in_thread(store, max_body_bytes=1000) as srv:
        big = Task(input={"blob": "x" * 2000}).model_dump_json()
        body = f'{{"tasks":[{big}]}}'.encode()
        r = httpx.post(f"{srv.url}/store/rollouts", content=body, headers=JSON_TYPE)
        assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large"
        assert "1,000" in r.json()["error"]["message"]

        def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it streams in
            yield body[:600]
            yield body[600:]

        r = httpx.post(f"{srv.url}/store/rollouts", content=chunks(), headers=JSON_TYPE)
        assert r.status_code == 413
        with HttpStore(srv.url) as http, pytest.raises(InvalidInput, match="over the limit"):
            http.enqueue([Task(input={"blob": "x" * 2000})])
    with serve_in_thread(store) as srv:  # default limits: a 50 MB task
        body = b'{"tasks":[{"input":{"blob":"' + b"x" * 50_000_000 + b'"}}]}'
        r = httpx.post(f"{srv.url}/store/rollouts", content=body, headers=JSON_TYPE, timeout=60)
        assert r.status_code == 400
        assert r.json()["error"]["message"].startswith("tasks[0].input: larger than")
    assert store.count() == 0


def test_values_that_would_not_read_back_are_refused_naming_the_field(tmp_path: Path) -> None:
    deep: dict[str, Any] = {}
    cur = deep
    for _ in range(220):  # a tool schema nested ~220 levels
        cur["items"] = {}
        cur = cur["items"]
    cases: list[tuple[dict[str, Any], str]] = [
        ({"x": math.nan}, "tasks[0].input.x: expected a finite number"),
        ({"x": [1.0, -math.inf]}, "tasks[0].input.x[1]: expected a finite number"),
        ({"x": 2**64}, "tasks[0].input.x: integer out of range"),
        ({"x": "\ud800"}, "tasks[0].input.x: string is not valid Unicode"),
        (deep, "tasks[0].input.items.items.items.+: nested deeper than 64 levels"),
        ({"x": "y" * (16 * 2**20)}, "tasks[0].input: larger than 16,777,216 bytes"),
    ]
    backing = MemoryStore()
    with serve_in_thread(backing) as srv:
        stores = [
            MemoryStore(),
            SqliteStore(tmp_path / "s.db"),
            HttpStore(srv.url),
        ]
        for s in stores:
            for value, message in cases:
                with pytest.raises(InvalidInput, match=r"^" + message.replace("[", r"\[")):
                    s.enqueue([Task(input=value)])
            [rid] = s.enqueue([Task(input={"ok": True})])
            att = s.claim("w")
            assert att is not None
            bad = LLMCall(id="c", rollout_id=rid, attempt=1, response_logprobs=[-0.5, -math.inf])
            with pytest.raises(InvalidInput, match=r"records\[0\].response_logprobs\[1\]"):
                s.record(att, [bad])
            assert s.get(rid).calls == []
            assert s.finish(att, "succeeded", reward=1.0).status == "succeeded"
            assert s.count() == 1
            s.close()
    backing.close()


def test_a_backend_minus_inf_logprob_fails_the_call_and_is_recorded_failed(
    tmp_path: Path,
) -> None:
    """In-process gateway + SQLite store: the call answers 502, the rollout stays readable
    and finishes; the failed call names the logprob."""
    store = SqliteStore(tmp_path / "g.db")
    (attempt,) = running(store)
    with serve(_Logprobs([-0.25, -math.inf]), store) as gw:
        r = httpx.post(f"{gw.rollout_url(attempt)}/chat/completions", json=_chat())
        assert r.status_code == 502 and r.json()["error"]["code"] == "backend_error"
        assert "response_logprobs[1]" in r.json()["error"]["message"]
    [call] = store.get(attempt.rollout_id).calls
    assert call.status == "failed" and "response_logprobs[1]" in (call.error or "")
    assert call.response_logprobs is None
    assert store.finish(attempt, "succeeded", reward=1.0).calls[0].status == "failed"
    store.close()


@pytest.mark.parametrize(
    "path, body, param",
    [
        (
            "chat/completions",
            {"messages": [{"role": ["user"], "content": "x"}]},
            "messages[0].role",
        ),
        (
            "chat/completions",
            {"messages": [{"role": {"a": 1}, "content": "x"}]},
            "messages[0].role",
        ),
        ("responses", {"input": "x", "max_output_tokens": 2**64 - 1}, "max_output_tokens"),
        ("responses", {"input": "x", "max_output_tokens": 1e23}, "max_output_tokens"),
        ("chat/completions", _chat(seed=2**70), "seed"),
        ("chat/completions", _chat(metadata={"k": 2**64 - 1}), "metadata.k"),
    ],
)
def test_gateway_refuses_what_it_could_not_record(
    store: Store, path: str, body: dict[str, Any], param: str
) -> None:
    (attempt,) = running(store)
    with serve(ScriptedBackend(["ok"]), store) as gw:
        r = httpx.post(f"{gw.rollout_url(attempt)}/{path}", json={"model": "m", **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    assert store.get(attempt.rollout_id).calls == []


def test_gateway_refuses_an_over_deep_tool_schema_before_generating(store: Store) -> None:
    schema: dict[str, Any] = {"type": "object"}
    for _ in range(220):
        schema = {"type": "object", "properties": {"p": schema}}
    tools = [{"type": "function", "function": {"name": "f", "parameters": schema}}]
    backend = ScriptedBackend(["ok"])
    (attempt,) = running(store)
    with serve(backend, store) as gw:
        r = httpx.post(f"{gw.rollout_url(attempt)}/chat/completions", json=_chat(tools=tools))
    assert r.status_code == 400 and "nested deeper than 64 levels" in r.json()["error"]["message"]
    assert r.json()["error"]["param"].startswith("tools[0].function.parameters.properties.p")
    assert backend.calls == 0 and store.get(attempt.rollout_id).calls == []


def test_numeric_query_parameters_are_bounded(store: Store) -> None:
    store.enqueue([Task(input={})])
    with serve_in_thread(store) as srv:
        for query in ("limit=10000000000000000000000", "offset=99999999999999999999", "limit=-1"):
            r = httpx.get(f"{srv.url}/store/rollouts?{query}")
            assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_input", query
            assert query.split("=")[0] in r.json()["error"]["message"]


# -- --store-token wherever a remote store is named ----------------------------------------


def test_gateway_serve_records_into_a_store_that_requires_a_token(store: Store) -> None:
    (attempt,) = running(store)
    with (
        serve_in_thread(store, token="st0re") as served,
        serve(ScriptedBackend(["from upstream"])) as upstream,
    ):
        cli = "import sys; from boltrl.cli import main; sys.exit(main())"
        argv = [sys.executable, "-c", cli, "gateway", "serve", "--upstream", f"{upstream.url}/v1"]
        argv += ["--model", "m", "--store", served.url, "--store-token", "st0re"]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            url = line.split(" on ")[1].split()[0]
            reply = client(f"{url}{attempt.route}/v1").chat.completions.create(**_chat())
            assert reply.choices[0].message.content == "from upstream"
        finally:
            proc.terminate()
            proc.wait(10)
    [call] = store.get(attempt.rollout_id).calls
    assert call.id == reply.id


def test_store_token_defaults_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from boltrl._serving import env_token

    monkeypatch.delenv("BOLTRL_STORE_TOKEN", raising=False)
    monkeypatch.delenv("BOLTRL_TOKEN", raising=False)
    assert env_token() is None
    monkeypatch.setenv("BOLTRL_TOKEN", "a")
    assert env_token() == "a"
    monkeypatch.setenv("BOLTRL_STORE_TOKEN", "b")
    assert env_token() == "b"
    with MemoryStore() as backing, serve_in_thread(backing, token="b") as srv:
        with open_store(srv.url, token=env_token()) as s:
            assert s.count() == 0
