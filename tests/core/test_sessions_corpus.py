"""The bad-input corpus of issue 15 over the session routes (issue 17 part 3): the
gateway's ``/sessions/{id}/v1`` calls, ``X-Boltrl-Session`` headers and feedback route,
and the store server's session routes, each field replaced by every odd JSON value, odd
ids, bodies, content types and query parameters. None may answer 5xx, and afterwards
every rollout (sessions included) still reads back and exports."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import test_bad_input_corpus as corpus
from test_bad_input_corpus import Case

from boltrl.export import write_transitions
from boltrl.gateway import Gateway, SessionConfig
from boltrl.store import SqliteStore
from boltrl.store.server import serve_in_thread
from boltrl.testing import ScriptedBackend

pytestmark = pytest.mark.timeout(300)

JSON_TYPE = {"content-type": "application/json"}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
ODD_HEADERS = ["", "a b", "x" * 200, "../x", "<script>", "s1,s2"]


def _gateway_cases() -> list[Case]:
    cases = list(corpus._mutations("POST", "/sessions/s-chat/v1/chat/completions", CHAT))
    cases += list(
        corpus._mutations("POST", "/sessions/s-fb/feedback", {"reward": 0.5, "name": "n"})
    )
    body = json.dumps(CHAT).encode()
    for odd in corpus.ODD_IDS:
        cases += [
            Case("POST", f"/sessions/{odd}/v1/chat/completions", body, JSON_TYPE),
            Case("POST", f"/sessions/{odd}/v1/responses", b'{"input": "x"}', JSON_TYPE),
            Case("GET", f"/sessions/{odd}/v1/models"),
            Case("POST", f"/sessions/{odd}/feedback", b'{"reward": 1}', JSON_TYPE),
        ]
    for odd in ODD_HEADERS:
        headers = {**JSON_TYPE, "x-boltrl-session": odd}
        cases += [
            Case("POST", "/v1/chat/completions", body, headers),
            Case("POST", "/sessions/s-chat/v1/chat/completions", body, headers),
        ]
    cases += [Case("GET", "/sessions/s-fb/feedback"), Case("PUT", "/sessions/s-fb/feedback")]
    return cases


def _store_cases() -> list[Case]:
    touch = {"session_id": "s-store", "feedback_timeout_s": 60, "metadata": {"k": "v"}}
    cases = list(corpus._mutations("POST", "/store/sessions/touch", touch))
    feedback = {"session_id": "s-store", "reward": 0.5, "name": "n"}
    cases += list(corpus._mutations("POST", "/store/sessions/feedback", feedback))
    cases += list(corpus._queries("/store/sessions/rewarded", ["after", "limit"]))
    cases += [
        Case("POST", "/store/sessions/expire", b"", JSON_TYPE),
        Case("GET", "/store/sessions/expire"),
        Case("GET", "/store/sessions/rewarded"),
    ]
    return cases


def test_no_bad_session_input_gets_a_5xx_and_everything_reads_back(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "corpus.db")
    store.touch_session("s-fb")  # open, so that its feedback route has something to refuse
    results: list[tuple[str, int, Case]] = []
    try:
        with (
            serve_in_thread(store) as store_srv,
            Gateway(ScriptedBackend(["ok"]), store, sessions=SessionConfig()) as gw,
            httpx.Client(timeout=30) as http,
        ):
            for name, base, cases in [
                ("gateway", gw.url, _gateway_cases()),
                ("store", store_srv.url, _store_cases()),
            ]:
                results += [(name, s, c) for s, c in corpus._send(http, base, cases)]
        errors = [(name, s, c) for name, s, c in results if s >= 500]
        assert not errors, errors[:5]
        statuses = sorted({s for _, s, _ in results})
        print(f"session corpus: {len(results)} cases, statuses {statuses}, 5xx: 0")
        assert len(results) > 300
        assert {200, 400, 404, 409, 415} <= set(statuses)
        rollouts = [store.get(h.id) for h in store.query(limit=10_000)]
        assert {"session-s-chat", "session-s-fb", "session-s-store"} <= {r.id for r in rollouts}
        write_transitions(rollouts, tmp_path / "t.jsonl")
        # the first valid feedback of the corpus (reward -1) closed it; the rest were refused
        fb = store.get("session-s-fb")
        assert (fb.reward, [r.value for r in fb.rewards]) == (-1.0, [-1.0])
    finally:
        store.close()
