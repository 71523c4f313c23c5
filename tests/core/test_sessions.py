"""Sessions on the gateway (issue 17 part 3): a deployed agent's calls recorded as a
session's rollout (URL and header forms), feedback arriving later (route and helper, from
another process), bad input refused with nothing written, expiry that is not a score of 0,
and feedback surviving a store restart. Real gateway over HTTP, real SQLite, the real
OpenAI SDK."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from gateway_util import client, normalized, scripted_call, serve
from store_harness import snapshot

from boltrl.credit import transitions
from boltrl.dashboard.app import create_dashboard_app
from boltrl.errors import InvalidInput, NotFound, SessionClosed, SessionExpired
from boltrl.feedback import send_feedback
from boltrl.gateway import Gateway, SessionConfig
from boltrl.records import AttemptOutcome, RolloutStatus
from boltrl.scoring import rollout_score
from boltrl.store import MemoryStore, SqliteStore, session_rollout_id, session_state
from boltrl.store.server import RunningServer
from boltrl.testing import ScriptedBackend

pytestmark = pytest.mark.timeout(60)

MSG = [{"role": "user", "content": "hi"}]
JSONH = {"content-type": "application/json"}


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    s = SqliteStore(tmp_path / "live.db")
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def gw(store: SqliteStore) -> Iterator[Gateway]:
    backend = ScriptedBackend(["hello", "again"], policy_version=3)
    with serve(backend, store, sessions=SessionConfig(feedback_timeout_s=60)) as g:
        yield g


def _post(url: str, body: Any = None, *, raw: bytes | None = None, **kw: Any) -> httpx.Response:
    if raw is None:
        return httpx.post(url, json=body, **kw)
    return httpx.post(url, content=raw, headers=kw.pop("headers", JSONH), **kw)


def _chat(base: str, **kw: Any) -> httpx.Response:
    return _post(f"{base}/chat/completions", {"model": "scripted", "messages": MSG}, **kw)


# -- calls --------------------------------------------------------------------------------------


def test_session_url_records_each_call_with_exact_ids_and_version(
    gw: Gateway, store: SqliteStore
) -> None:
    llm = client(gw.session_url("user-1.conv:7"))
    first = llm.chat.completions.create(model="scripted", messages=MSG)  # type: ignore[arg-type]
    resp = llm.responses.create(model="scripted", input="and now?")
    assert [m.id for m in llm.models.list()] == ["scripted"]
    assert first.choices[0].message.content == "hello" and resp.output_text == "again"

    ro = store.get(session_rollout_id("user-1.conv:7"))
    assert ro.id == "session-user-1.conv:7"
    assert ro.status is RolloutStatus.RUNNING and session_state(ro) == "open"
    assert ro.task.input == {"session": "user-1.conv:7"}
    assert ro.task.metadata == {"source": "live", "session": "user-1.conv:7"}
    att = ro.attempts[0]
    assert (len(ro.attempts), att.worker_id, att.number, att.token) == (1, "session", 1, None)
    assert [c.id for c in ro.calls] == [first.id, resp.id]
    assert normalized(ro.calls[0]) == scripted_call(
        first.id,
        att,
        {"api": "chat.completions", "model": "scripted", "messages": MSG},
        text="hello",
        policy_version=3,
    )
    second = ro.calls[1]
    assert (second.policy_version, second.response_token_ids) == (3, list(b"again"))
    assert second.response_logprobs is not None and len(second.response_logprobs) == 5
    # The deadline is the attempt's lease: feedback_timeout_s after the last call.
    assert att.lease_expires_at == pytest.approx(second.ended_at + 60, abs=2)


def test_header_form_records_and_contradictions_are_refused(
    gw: Gateway, store: SqliteStore
) -> None:
    llm = openai.OpenAI(
        base_url=f"{gw.url}/v1",
        api_key="x",
        max_retries=0,
        default_headers={"X-Boltrl-Session": "hdr-1"},
    )
    out = llm.chat.completions.create(model="scripted", messages=MSG)  # type: ignore[arg-type]
    assert [c.id for c in store.get("session-hdr-1").calls] == [out.id]
    same = _chat(f"{gw.url}/sessions/hdr-1/v1", headers={"X-Boltrl-Session": "hdr-1"})
    assert same.status_code == 200
    assert len(store.get("session-hdr-1").calls) == 2

    before = snapshot(store)
    other = _chat(f"{gw.url}/sessions/hdr-1/v1", headers={"X-Boltrl-Session": "hdr-2"})
    assert other.status_code == 400
    assert other.json()["error"]["code"] == "session_mismatch"
    assert "hdr-2" in other.json()["error"]["message"]
    on_rollout = _chat(f"{gw.url}/rollouts/ro-x/v1", headers={"X-Boltrl-Session": "hdr-1"})
    assert on_rollout.status_code == 400
    assert on_rollout.json()["error"]["code"] == "session_on_rollout_route"
    assert snapshot(store) == before


@pytest.mark.parametrize(
    ("where", "sid"),
    [("url", "has%20space"), ("url", "x" * 129), ("header", "a/b"), ("header", "")],
)
def test_bad_session_id_is_a_400_naming_the_rule(
    gw: Gateway, store: SqliteStore, where: str, sid: str
) -> None:
    if where == "url":
        r = _chat(f"{gw.url}/sessions/{sid}/v1")
    else:
        r = _chat(f"{gw.url}/v1", headers={"X-Boltrl-Session": sid})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "session_id" and "[A-Za-z0-9._:-]{1,128}" in err["message"]
    assert store.count() == 0


def test_a_training_gateway_serves_no_session(store: SqliteStore) -> None:
    with serve(ScriptedBackend(["hi"]), store) as g:
        assert _chat(f"{g.url}/sessions/s1/v1").status_code == 404
        assert _post(f"{g.url}/sessions/s1/feedback", {"reward": 1}).status_code == 404
        r = _chat(f"{g.url}/v1", headers={"X-Boltrl-Session": "s1"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "sessions_disabled"
        assert _chat(f"{g.url}/v1").status_code == 200  # plain /v1 still unrecorded
    assert store.count() == 0


def test_sessions_need_a_store_that_keeps_them() -> None:
    with pytest.raises(InvalidInput, match="sessions: need a store"):
        Gateway(ScriptedBackend(["hi"]), None, sessions=SessionConfig())
    with pytest.raises(InvalidInput, match="feedback_timeout_s"):
        SessionConfig(feedback_timeout_s=0)


def test_the_gateway_token_guards_sessions_and_feedback(store: SqliteStore) -> None:
    with serve(ScriptedBackend(["hi"]), store, token="s3cret", sessions=SessionConfig()) as g:
        assert _chat(f"{g.url}/sessions/s1/v1").status_code == 401
        assert _post(f"{g.url}/sessions/s1/feedback", {"reward": 1}).status_code == 401
        assert store.count() == 0
        auth = {"authorization": "Bearer s3cret"}
        assert _chat(f"{g.url}/sessions/s1/v1", headers=auth).status_code == 200
        with pytest.raises(Exception, match="Incorrect API key"):
            send_feedback(g.url, "s1", 1.0)
        assert send_feedback(g.url, "s1", 1.0, token="s3cret").status == "succeeded"


# -- feedback -----------------------------------------------------------------------------------


def test_feedback_rewards_the_session_as_its_return(gw: Gateway, store: SqliteStore) -> None:
    assert _chat(gw.session_url("fb")).status_code == 200
    r = _post(f"{gw.url}/sessions/fb/feedback", {"reward": 0.25, "name": "thumbs"})
    assert r.status_code == 200
    assert r.json() == {
        "session_id": "fb",
        "rollout_id": "session-fb",
        "status": "succeeded",
        "reward": 0.25,
        "name": "thumbs",
    }
    ro = store.get("session-fb")
    assert (ro.status, ro.reward, session_state(ro)) == (RolloutStatus.SUCCEEDED, 0.25, "rewarded")
    assert ro.attempts[0].outcome is AttemptOutcome.SUCCEEDED
    [event] = ro.rewards
    assert (event.id, event.value, event.name, event.final) == ("feedback", 0.25, "thumbs", True)
    assert rollout_score(ro) == 0.25
    assert rollout_score(ro, "discounted") == 0.25  # the reward event is not counted twice
    [step] = transitions(ro)
    assert (step.reward, step.done, step.policy_version) == (0.25, True, 3)
    page = store.rewarded_sessions()
    assert [x.id for x in page.rollouts] == ["session-fb"] and page.cursor == event.seq
    # a closed session takes no more calls
    late = _chat(gw.session_url("fb"))
    assert late.status_code == 409 and late.json()["error"]["code"] == "session_closed"


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        (b'{"reward": NaN}', "reward"),
        (b'{"reward": Infinity}', "reward"),
        (b'{"reward": -1e999}', "reward"),
        (b'{"reward": "0.5"}', "reward"),
        (b'{"reward": true}', "reward"),
        (b'{"reward": null}', "reward"),
        (b'{"name": "x"}', "reward"),
        (b'{"reward": 1, "name": 5}', "name"),
        (b'{"reward": 1, "score": 2}', "score"),
        (b'{"reward": 1', None),
        (b"[1]", None),
    ],
)
def test_malformed_feedback_is_a_400_and_writes_nothing(
    gw: Gateway, store: SqliteStore, raw: bytes, param: str | None
) -> None:
    assert _chat(gw.session_url("bad")).status_code == 200
    before = snapshot(store)
    r = _post(f"{gw.url}/sessions/bad/feedback", raw=raw)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    assert snapshot(store) == before


def test_feedback_refusals_name_the_problem_and_write_nothing(
    gw: Gateway, store: SqliteStore
) -> None:
    assert _chat(gw.session_url("twice")).status_code == 200
    assert _post(f"{gw.url}/sessions/twice/feedback", {"reward": 1}).status_code == 200
    before = snapshot(store)
    cases = [
        (_post(f"{gw.url}/sessions/nobody/feedback", {"reward": 1}), 404, "nobody"),
        (_post(f"{gw.url}/sessions/twice/feedback", {"reward": 0}), 409, "already received"),
        (_post(f"{gw.url}/sessions/a%20b/feedback", {"reward": 0}), 400, "session_id"),
        (
            _post(
                f"{gw.url}/sessions/twice/feedback", raw=b'{"reward": 1}', headers={}
            ),  # no JSON content type
            415,
            "application/json",
        ),
    ]
    for resp, status, words in cases:
        assert resp.status_code == status, resp.text
        assert words in resp.json()["error"]["message"]
    assert snapshot(store) == before
    assert store.get("session-twice").reward == 1.0


DEADLINE_S = 1.0
"""Feedback deadline of the expiry tests: long enough that a loaded machine still sends the
feedback that should arrive in time (0.3 s lost one beside a training run)."""


def _expiring(store: SqliteStore, sweep_s: float = 30.0) -> Gateway:
    cfg = SessionConfig(feedback_timeout_s=DEADLINE_S, sweep_interval_s=sweep_s)
    return Gateway(ScriptedBackend(["hi"]), store, sessions=cfg)


def test_no_feedback_by_the_deadline_expires_the_session_not_a_zero(store: SqliteStore) -> None:
    with _expiring(store) as g:
        assert _chat(g.session_url("late")).status_code == 200
        assert _chat(g.session_url("kept")).status_code == 200
        assert _post(f"{g.url}/sessions/kept/feedback", {"reward": 0.0}).status_code == 200
        time.sleep(DEADLINE_S + 0.2)
        before = snapshot(store)
        r = _post(f"{g.url}/sessions/late/feedback", {"reward": 1})
        assert r.status_code == 410 and "no feedback by deadline" in r.json()["error"]["message"]
        again = _chat(g.session_url("late"))
        assert again.status_code == 410 and again.json()["error"]["code"] == "session_expired"
        assert snapshot(store) == before
    ro = store.get("session-late")
    assert (ro.status, ro.reward, session_state(ro)) == (RolloutStatus.CANCELLED, None, "expired")
    assert ro.attempts[0].error_kind == "no_feedback" and ro.rewards == []
    assert rollout_score(ro) is None  # not scored 0: the session that got 0 is
    assert rollout_score(store.get("session-kept")) == 0.0
    assert [x.id for x in store.rewarded_sessions().rollouts] == ["session-kept"]
    assert [x.id for x in store.query(status="succeeded")] == ["session-kept"]


def test_the_sweeper_closes_expired_sessions_without_traffic(store: SqliteStore) -> None:
    with _expiring(store, sweep_s=0.05) as g:
        assert _chat(g.session_url("idle")).status_code == 200
        time.sleep(DEADLINE_S + 0.5)  # sweeps every 0.05 s
        # Every store call expires lazily, so ask the sweep itself: nothing left to close.
        assert store.expire_sessions() == 0
    assert session_state(store.get("session-idle")) == "expired"
    with _expiring(store, sweep_s=30) as g:  # and without a sweep, the store's own call does
        assert _chat(g.session_url("idle2")).status_code == 200
        time.sleep(DEADLINE_S + 0.2)
        assert store.expire_sessions() == 1


def test_feedback_survives_a_store_restart(tmp_path: Path) -> None:
    path = tmp_path / "restart.db"
    cfg = SessionConfig(feedback_timeout_s=60)
    store = SqliteStore(path)
    with serve(ScriptedBackend(["hi"]), store, sessions=cfg) as g:
        call = client(g.session_url("r1")).chat.completions.create(
            model="scripted",
            messages=MSG,  # type: ignore[arg-type]
        )
    store.close()

    store = SqliteStore(path)  # a new process would see the same: all state is in the file
    try:
        with serve(ScriptedBackend(["hi"]), store, sessions=cfg) as g:
            assert send_feedback(g.url, "r1", 0.5).reward == 0.5
            assert _chat(g.session_url("r1")).status_code == 409
        page = store.rewarded_sessions()
        [ro] = page.rollouts
        assert [c.id for c in ro.calls] == [call.id] and ro.reward == 0.5
        assert store.rewarded_sessions(after=page.cursor).rollouts == []
    finally:
        store.close()


def test_a_deadline_survives_a_store_restart(tmp_path: Path) -> None:
    path = tmp_path / "deadline.db"
    store = SqliteStore(path)
    attempt = store.touch_session("d1", feedback_timeout_s=0.3)
    assert attempt.token
    store.close()
    time.sleep(0.5)
    store = SqliteStore(path)
    try:
        with pytest.raises(SessionExpired, match="no feedback by deadline"):
            store.feedback("d1", 1.0)
        assert session_state(store.get("session-d1")) == "expired"
    finally:
        store.close()


# -- the helper ---------------------------------------------------------------------------------


def test_the_helper_works_from_another_process(gw: Gateway, store: SqliteStore) -> None:
    assert _chat(gw.session_url("proc")).status_code == 200
    code = (
        "import sys; from boltrl.feedback import send_feedback\n"
        "fb = send_feedback(sys.argv[1], 'proc', 0.75, name='later')\n"
        "print(fb.rollout_id, fb.status, fb.reward, fb.name)\n"
    )
    url = gw.session_url("proc")  # the session's base URL is accepted as well as the root
    done = subprocess.run(
        [sys.executable, "-c", code, url], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["session-proc", "succeeded", "0.75", "later"]
    ro = store.get("session-proc")
    assert (ro.reward, ro.rewards[0].name) == (0.75, "later")


def test_the_helper_raises_what_the_gateway_refused(gw: Gateway) -> None:
    assert _chat(gw.session_url("h")).status_code == 200
    with pytest.raises(NotFound, match="unknown session 'nobody'"):
        send_feedback(gw.url, "nobody", 1.0)
    with pytest.raises(InvalidInput, match="reward: must be a finite number"):
        send_feedback(gw.url, "h", float("nan"))
    with pytest.raises(InvalidInput, match="session_id"):
        send_feedback(gw.url, "no spaces", 1.0)
    send_feedback(f"{gw.url}/v1", "h", 1.0)
    with pytest.raises(SessionClosed, match="already received"):
        send_feedback(gw.url, "h", 1.0)


def test_memory_store_keeps_sessions_too() -> None:
    store = MemoryStore()
    with serve(ScriptedBackend(["hi"]), store, sessions=SessionConfig()) as g:
        assert _chat(g.session_url("m")).status_code == 200
        assert send_feedback(g.url, "m", 1.0).status == "succeeded"
    assert [r.id for r in store.rewarded_sessions().rollouts] == ["session-m"]


def test_the_dashboard_lists_sessions_as_rollouts(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "dash.db")
    cfg = SessionConfig(feedback_timeout_s=DEADLINE_S)
    try:
        with serve(ScriptedBackend(["hi"], policy_version=4), store, sessions=cfg) as g:
            for sid in ("open", "rated", "gone"):
                assert _chat(g.session_url(sid)).status_code == 200
            send_feedback(g.url, "rated", 1.0)
            time.sleep(DEADLINE_S + 0.2)
            assert _chat(g.session_url("open")).status_code == 410  # expired by now too
            assert _chat(g.session_url("fresh")).status_code == 200
        app = create_dashboard_app(store, poll_s=0.1)
        server = RunningServer(app)
        try:
            rows = httpx.get(f"{server.url}/api/rollouts", timeout=30).json()["rows"]
        finally:
            app.state.dashboard.close()
            server.stop()
    finally:
        store.close()
    seen = {r["id"]: (r["status"], r["reward"], r["error_kind"], r["worker"]) for r in rows}
    assert seen == {
        "session-open": ("cancelled", None, "no_feedback", "session"),
        "session-rated": ("succeeded", 1.0, None, "session"),
        "session-gone": ("cancelled", None, "no_feedback", "session"),
        "session-fresh": ("running", None, None, "session"),
    }
    assert {r["id"]: r["policy_versions"] for r in rows}["session-rated"] == [4]


def test_cli_gateway_serve_with_sessions_records_and_takes_feedback(tmp_path: Path) -> None:
    db = tmp_path / "cli.db"
    with serve(ScriptedBackend(["from upstream"])) as up:
        base = [sys.executable, "-m", "boltrl.cli", "gateway", "serve", "--upstream"]
        argv = [*base, f"{up.url}/v1", "--model", "scripted", "--port", "0"]
        refused = subprocess.run([*argv, "--sessions"], capture_output=True, text=True)
        assert refused.returncode == 2 and "--sessions: needs --store" in refused.stdout
        proc = subprocess.Popen(
            [*argv, "--store", f"sqlite:///{db}", "--sessions", "--feedback-timeout", "90"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            url = line.split(" on ")[1].split()[0]
            assert "/sessions/SESSION_ID/v1" in proc.stdout.readline()
            assert _chat(f"{url}/sessions/cli-1/v1").status_code == 200
            assert send_feedback(url, "cli-1", 0.5).status == "succeeded"
        finally:
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, out + err
    store = SqliteStore(db)
    try:
        ro = store.get("session-cli-1")
        assert ro.reward == 0.5 and len(ro.calls) == 1
        assert ro.calls[0].response["message"]["content"] == "from upstream"
    finally:
        store.close()


def test_feedback_during_a_call_closes_the_session_and_the_call_is_not_recorded(
    store: SqliteStore,
) -> None:
    with serve(ScriptedBackend(["slow"], delay_s=1.0), store, sessions=SessionConfig()) as g:
        out: list[httpx.Response] = []
        t = threading.Thread(target=lambda: out.append(_chat(g.session_url("race"))))
        t.start()
        deadline = time.monotonic() + 10
        while store.count() == 0 and time.monotonic() < deadline:
            time.sleep(0.02)  # until the call has opened the session
        assert send_feedback(g.url, "race", 1.0).status == "succeeded"
        t.join(20)
    [resp] = out
    assert resp.status_code == 409 and "not recorded" in resp.json()["error"]["message"]
    ro = store.get("session-race")
    assert (ro.reward, ro.calls, session_state(ro)) == (1.0, [], "rewarded")
