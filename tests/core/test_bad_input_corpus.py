"""A bad-input corpus over the three servers (store, gateway, dashboard): malformed and
hostile requests, each field of each route's body replaced by every odd JSON value,
odd query parameters, path segments, content types and Host headers. None may answer
5xx, and afterwards every rollout still reads back and exports (issue 15)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from gateway_util import running

from boltrl._serving import local_hosts
from boltrl.dashboard import create_dashboard_app
from boltrl.export import write_transitions
from boltrl.gateway import Gateway
from boltrl.records import LLMCall, Resources, Task
from boltrl.store import MemoryStore
from boltrl.store.server import RunningServer, serve_in_thread
from boltrl.testing import ScriptedBackend

pytestmark = pytest.mark.timeout(300)

ODD_VALUES: list[bytes] = [
    b"null",
    b"true",
    b"-1",
    b"0",
    b"1.5",
    b"1e308",
    b"-1e999",  # infinity once parsed
    b"NaN",
    b"Infinity",
    b"99999999999999999999999999999",
    b"18446744073709551615",
    b'""',
    b'"x"',
    b'"\\ud800"',  # a lone surrogate
    b"[]",
    b"[null]",
    b"{}",
    b'{"a": NaN}',
    b"[" * 300 + b"]" * 300,
    b'{"a":' * 100 + b"1" + b"}" * 100,
]
RAW_BODIES: list[bytes] = [
    b"",
    b"{",
    b"[]",
    b"null",
    b"1",
    b'"s"',
    b"{}",
    b"\xff\xfe\x00",
    b'{"a": 1,}',
    b"[" * 5000 + b"]" * 5000,
    b'{"x": "' + b"y" * 100_000 + b'"}',
]
ODD_PARAMS = [
    "",
    "-1",
    "0",
    "abc",
    "1e3",
    "nan",
    "inf",
    "99999999999999999999999",
    "%00",
    "x" * 5000,
]
ODD_IDS = ["%00", "..%2F..", "x" * 5000, "%F0%9F%A6%84", "ro-nope", "%22%3Cscript%3E"]


@dataclass
class Case:
    method: str
    path: str
    body: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)


def _mutations(method: str, path: str, valid: dict[str, Any]) -> Iterator[Case]:
    """The valid body with each field replaced by each odd value, dropped, or joined by
    an unknown one; raw odd bodies; and the valid body with odd content types."""
    json_type = {"content-type": "application/json"}
    base = json.dumps(valid).encode()
    for key in valid:
        for odd in ODD_VALUES:
            rest = json.dumps({k: v for k, v in valid.items() if k != key})[1:-1]
            sep = ", " if rest else ""
            body = (
                b"{" + rest.encode() + sep.encode() + json.dumps(key).encode() + b": " + odd + b"}"
            )
            yield Case(method, path, body, json_type)
        yield Case(
            method,
            path,
            json.dumps({k: v for k, v in valid.items() if k != key}).encode(),
            json_type,
        )
    yield Case(method, path, base[:-1] + b', "unknown_field": 1}', json_type)
    for raw in RAW_BODIES:
        yield Case(method, path, raw, json_type)
    for ctype in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data", ""):
        yield Case(method, path, base, {"content-type": ctype} if ctype else {})
    yield Case(method, path, base, {**json_type, "host": "rebound.example"})
    yield Case(method, path, base, {**json_type, "authorization": "Bearer \x7f" + "x" * 3000})


def _queries(path: str, names: list[str]) -> Iterator[Case]:
    for name in names:
        for value in ODD_PARAMS:
            yield Case("GET", f"{path}?{name}={value}")


def _store_cases(rid: str, attempt: dict[str, Any]) -> list[Case]:
    call = LLMCall(id="corpus-call", rollout_id=rid, attempt=attempt["number"]).model_dump(
        mode="json"
    )
    bodies: list[tuple[str, dict[str, Any]]] = [
        ("/store/rollouts", {"tasks": [{"input": {"q": 1}}], "max_attempts": 2, "timeout_s": 60}),
        ("/store/claim", {"worker_id": "w-corpus", "lease_s": 30, "wait_s": 0}),
        ("/store/heartbeat", {"attempt": attempt, "lease_s": 30}),
        ("/store/records", {"items": [{"attempt": attempt, "records": [call]}]}),
        ("/store/wait", {"ids": ["done"], "timeout_s": 0}),  # terminal: never blocks
        ("/store/resources", Resources().model_dump(mode="json")),
        ("/store/finish", {"attempt": attempt, "status": "succeeded", "reward": 1.0}),
    ]
    cases = [c for path, valid in bodies for c in _mutations("POST", path, valid)]
    cases += list(_queries("/store/rollouts", ["limit", "offset", "status"]))
    cases += list(_queries("/store/count", ["status"]))
    for odd in ODD_IDS:
        cases += [
            Case("GET", f"/store/rollouts/{odd}"),
            Case("GET", f"/store/rollouts/{odd}/current_attempt"),
            Case(
                "POST", f"/store/rollouts/{odd}/cancel", b"", {"content-type": "application/json"}
            ),
        ]
    cases += [Case("GET", p) for p in ("/store/resources", "/store/workers", "/healthz", "/nope")]
    cases += [Case("DELETE", "/store/rollouts"), Case("PUT", "/store/claim", b"{}")]
    return cases


def _gateway_cases(route: str) -> list[Case]:
    chat = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
        "tool_choice": "auto",
        "temperature": 0.5,
        "top_p": 0.9,
        "max_tokens": 8,
        "stop": ["x"],
        "seed": 1,
        "n": 1,
        "stream": False,
        "stream_options": {"include_usage": True},
        "logprobs": False,
        "return_token_ids": False,
    }
    message_fields = {
        "role": "user",
        "content": "hi",
        "name": "n",
        "tool_calls": [],
        "tool_call_id": "t",
    }
    resp = {
        "model": "m",
        "input": [{"role": "user", "content": "hi"}],
        "instructions": "be brief",
        "tools": [{"type": "function", "name": "f", "parameters": {}}],
        "max_output_tokens": 8,
        "temperature": 0.5,
        "metadata": {"k": "v"},
        "stream": False,
    }
    cases: list[Case] = []
    for prefix in (route, "/v1"):
        cases += list(_mutations("POST", f"{prefix}/chat/completions", chat))
        cases += list(_mutations("POST", f"{prefix}/responses", resp))
        for valid in (message_fields,):
            for c in _mutations("POST", f"{prefix}/chat/completions", valid):
                if c.body is not None and c.body[:1] == b"{":
                    wrapped = b'{"model": "m", "messages": [' + c.body + b"]}"
                    cases.append(Case(c.method, c.path, wrapped, c.headers))
        cases += [Case("GET", f"{prefix}/models"), Case("GET", f"{prefix}/models/{'x' * 3000}")]
    for odd in ODD_IDS:
        cases.append(
            Case(
                "POST",
                f"/rollouts/{odd}/v1/chat/completions",
                json.dumps(chat).encode(),
                {"content-type": "application/json"},
            )
        )
        cases.append(
            Case(
                "POST",
                f"/rollouts/{odd}/attempts/{odd}/{odd}/v1/responses",
                json.dumps(resp).encode(),
                {"content-type": "application/json"},
            )
        )
    cases += [
        Case("GET", "/health"),
        Case("GET", "/v1/chat/completions"),
        Case("PATCH", "/v1/responses"),
    ]
    return cases


def _dashboard_cases(rid: str) -> list[Case]:
    cases = list(_queries("/api/rollouts", ["status", "run", "agent", "task", "limit", "offset"]))
    cases += list(_queries(f"/api/rollouts/{rid}", ["credit", "gamma"]))
    for odd in ODD_IDS:
        cases += [
            Case("GET", f"/api/rollouts/{odd}"),
            Case("GET", f"/api/rollouts/{rid}/calls/{odd}/tokens"),
        ]
    cases += [
        Case("GET", p)
        for p in (
            "/api/summary",
            "/api/runs",
            "/api/facets",
            "/api/workers",
            "/",
            "/static/app.js",
            "/static/%2e%2e/app.py",
        )
    ]
    cases += [Case("GET", "/api/runs", headers={"host": "rebound.example"})]
    cases += [
        Case("POST", "/api/runs", b"{}", {"content-type": "application/json"}),
        Case("GET", "/?token="),
    ]
    return cases


def _send(http: httpx.Client, base: str, cases: list[Case]) -> list[tuple[int, Case]]:
    out = []
    for c in cases:
        r = http.request(c.method, base + c.path, content=c.body, headers=c.headers)
        out.append((r.status_code, c))
    return out


def test_no_bad_input_gets_a_5xx_and_everything_still_reads_back(tmp_path: Path) -> None:
    store = MemoryStore()
    store.enqueue([Task(id="done", input={"q": 0})])
    done = store.claim("w-setup")
    assert done is not None
    store.finish(done, "succeeded", reward=1.0)
    (live,) = running(store)
    attempt = live.model_dump(mode="json")
    results: list[tuple[str, int, Case]] = []
    dash = create_dashboard_app(store, allowed_hosts=local_hosts("127.0.0.1"), poll_s=0.2)
    dash_server = RunningServer(dash)
    try:
        with (
            serve_in_thread(store) as store_srv,
            Gateway(ScriptedBackend(["ok"]), store) as gw,
            httpx.Client(timeout=30) as http,
        ):
            groups = [
                ("gateway", gw.url, _gateway_cases(live.route)),
                ("dashboard", dash_server.url, _dashboard_cases(live.rollout_id)),
                ("store", store_srv.url, _store_cases(live.rollout_id, attempt)),
            ]
            for name, base, cases in groups:
                results += [(name, status, c) for status, c in _send(http, base, cases)]
    finally:
        dash.state.dashboard.close()
        dash_server.stop()
    errors = [(name, s, c) for name, s, c in results if s >= 500]
    assert not errors, errors[:5]
    by_server = {n: sum(1 for m, _, _ in results if m == n) for n, _, _ in results}
    statuses = sorted({s for _, s, _ in results})
    print(f"bad-input corpus: {len(results)} cases {by_server}, statuses {statuses}, 5xx: 0")
    assert len(results) > 1500
    assert any(s == 200 for _, s, _ in results)  # the valid bodies were served
    heads = store.query(limit=10_000)
    rollouts = [store.get(h.id) for h in heads]  # every rollout still reads back
    write_transitions(rollouts, tmp_path / "t.jsonl")
    store.close()
