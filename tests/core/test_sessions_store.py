"""The SessionStore contract (issue 17 part 3) against memory, SQLite and HTTP alike: a
session opens running without a claim, takes its calls under its own fenced attempt,
closes on feedback (atomically, once), expires as ``no_feedback`` (no score, never
listed), and a learner pages through rewarded sessions by cursor."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from gateway_util import serve
from store_harness import KINDS, Opened, open_kind, snapshot

from boltrl.errors import InvalidInput, NotFound, SessionClosed, SessionExpired, StaleAttempt
from boltrl.feedback import send_feedback
from boltrl.gateway import SessionConfig
from boltrl.records import LLMCall, RolloutStatus, Task
from boltrl.scoring import rollout_score
from boltrl.store import SessionStore, session_state
from boltrl.testing import ScriptedBackend

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(params=KINDS)
def opened(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opened]:
    o = open_kind(request.param, tmp_path)
    try:
        yield o
    finally:
        o.close()


@pytest.fixture
def store(opened: Opened) -> SessionStore:
    assert isinstance(opened.store, SessionStore)
    return opened.store


def _call(rollout_id: str, call_id: str) -> LLMCall:
    return LLMCall(
        id=call_id,
        rollout_id=rollout_id,
        attempt=1,
        prompt_token_ids=[1, 2],
        response_token_ids=[3],
        response_logprobs=[-0.5],
        policy_version=2,
    )


def test_a_session_opens_running_without_a_claim_and_keeps_its_token(
    store: SessionStore, opened: Opened
) -> None:
    s = opened.store
    s.enqueue([Task(input={"q": 1})])
    first = store.touch_session("u1", feedback_timeout_s=100, metadata={"user": "ann"})
    assert first.token and first.rollout_id == "session-u1" and first.worker_id == "session"
    assert first.task is not None and first.task.metadata == {
        "user": "ann",
        "source": "live",
        "session": "u1",
    }
    s.record(first, [_call(first.rollout_id, "c1")])
    time.sleep(0.01)
    again = store.touch_session("u1", feedback_timeout_s=100)
    assert again.token == first.token and again.lease_expires_at > first.lease_expires_at
    s.record(again, [_call(first.rollout_id, "c2")])
    forged = again.model_copy(update={"token": "x" * 32})
    with pytest.raises(StaleAttempt):
        s.record(forged, [_call(first.rollout_id, "c3")])
    # a runner's claim never takes a session
    claimed = s.claim("runner")
    assert claimed is not None and claimed.rollout_id != "session-u1"
    assert s.claim("runner") is None
    ro = s.get("session-u1")
    assert [c.id for c in ro.calls] == ["c1", "c2"] and ro.status is RolloutStatus.RUNNING
    assert first.token not in " ".join(r.model_dump_json() for r in [ro, *s.query()])


def test_feedback_closes_once_and_bad_input_changes_nothing(
    store: SessionStore, opened: Opened
) -> None:
    att = store.touch_session("f1")
    opened.store.record(att, [_call(att.rollout_id, "c1")])
    before = snapshot(opened.store)
    for bad, field in [
        (lambda: store.feedback("f1", float("nan")), "reward"),
        (lambda: store.feedback("f1", float("inf")), "reward"),
        (lambda: store.feedback("f1", "1"), "reward"),  # type: ignore[arg-type]
        (lambda: store.feedback("f1", True), "reward"),
        (lambda: store.feedback("f1", 1.0, name=""), "name"),
        (lambda: store.feedback("bad id", 1.0), "session_id"),
        (lambda: store.touch_session("x" * 129), "session_id"),
        (lambda: store.touch_session("f2", feedback_timeout_s=0), "feedback_timeout_s"),
    ]:
        with pytest.raises(InvalidInput, match=field):
            bad()
    with pytest.raises(NotFound, match="unknown session 'nobody'"):
        store.feedback("nobody", 1.0)
    assert snapshot(opened.store) == before

    done = store.feedback("f1", -0.5, name="stars")
    assert (done.status, done.reward) == (RolloutStatus.SUCCEEDED, -0.5)
    assert [(r.id, r.value, r.name, r.final) for r in done.rewards] == [
        ("feedback", -0.5, "stars", True)
    ]
    assert rollout_score(done) == -0.5 and session_state(done) == "rewarded"
    after = snapshot(opened.store)
    with pytest.raises(SessionClosed, match="already received"):
        store.feedback("f1", 1.0)
    with pytest.raises(SessionClosed):
        store.touch_session("f1")
    with pytest.raises(StaleAttempt):
        opened.store.record(att, [_call(att.rollout_id, "late")])
    assert snapshot(opened.store) == after


def test_expired_sessions_have_no_score_and_are_never_listed(
    store: SessionStore, opened: Opened
) -> None:
    a = store.touch_session("gone", feedback_timeout_s=0.2)
    opened.store.record(a, [_call(a.rollout_id, "c1")])
    store.touch_session("rated", feedback_timeout_s=0.2)
    store.feedback("rated", 0.0)
    time.sleep(0.3)
    assert store.expire_sessions() == 1
    assert store.expire_sessions() == 0
    ro = opened.store.get("session-gone")
    assert (ro.status, ro.reward, ro.rewards) == (RolloutStatus.CANCELLED, None, [])
    assert ro.attempts[0].error_kind == "no_feedback" and "no feedback by deadline" in (
        ro.error or ""
    )
    assert session_state(ro) == "expired" and rollout_score(ro) is None
    before = snapshot(opened.store)
    with pytest.raises(SessionExpired, match="no feedback by deadline"):
        store.feedback("gone", 1.0)
    with pytest.raises(SessionExpired):
        store.touch_session("gone")
    assert snapshot(opened.store) == before
    assert [r.id for r in store.rewarded_sessions().rollouts] == ["session-rated"]


def test_expiry_is_lazy_on_feedback_without_any_sweep(store: SessionStore) -> None:
    store.touch_session("lazy", feedback_timeout_s=0.1)
    time.sleep(0.2)
    with pytest.raises(SessionExpired):
        store.feedback("lazy", 1.0)


def test_a_cancelled_session_takes_no_feedback(store: SessionStore, opened: Opened) -> None:
    store.touch_session("c")
    opened.store.cancel("session-c")
    with pytest.raises(SessionClosed, match="cancelled"):
        store.feedback("c", 1.0)
    assert session_state(opened.store.get("session-c")) == "cancelled"


def test_a_learner_pages_rewarded_sessions_by_cursor(store: SessionStore, opened: Opened) -> None:
    for sid in ("a", "b", "c", "open"):
        att = store.touch_session(sid)
        opened.store.record(att, [_call(att.rollout_id, f"call-{sid}")])
    for sid in ("b", "a"):
        store.feedback(sid, 1.0)
    page = store.rewarded_sessions(limit=1)
    assert [r.id for r in page.rollouts] == ["session-b"]
    assert [c.id for c in page.rollouts[0].calls] == ["call-b"]  # with its records
    page2 = store.rewarded_sessions(after=page.cursor, limit=10)
    assert [r.id for r in page2.rollouts] == ["session-a"] and page2.cursor > page.cursor
    empty = store.rewarded_sessions(after=page2.cursor)
    assert (empty.rollouts, empty.cursor) == ([], page2.cursor)
    store.feedback("c", 0.5)  # arrives later: shows after the cursor the learner holds
    assert [r.id for r in store.rewarded_sessions(after=page2.cursor).rollouts] == ["session-c"]
    assert all(a.token is None for r in page.rollouts for a in r.attempts)
    for bad in ({"after": -1}, {"limit": -1}, {"limit": 10_001}):
        with pytest.raises(InvalidInput):
            store.rewarded_sessions(**bad)


def test_a_gateway_over_an_http_store_serves_sessions(tmp_path: Path) -> None:
    o = open_kind("http", tmp_path)
    try:
        with serve(ScriptedBackend(["hi"]), o.store, sessions=SessionConfig()) as g:
            r = httpx.post(
                f"{g.session_url('h1')}/chat/completions",
                json={"model": "scripted", "messages": [{"role": "user", "content": "x"}]},
            )
            assert r.status_code == 200
            assert send_feedback(g.url, "h1", 1.0).status == "succeeded"
            with pytest.raises(SessionClosed):
                send_feedback(g.url, "h1", 1.0)
        assert o.backing is not None
        ro = o.backing.get("session-h1")
        assert ro.reward == 1.0 and [c.id for c in ro.calls] == [r.json()["id"]]
    finally:
        o.close()


def test_a_retried_http_feedback_answers_the_first_success(tmp_path: Path) -> None:
    o = open_kind("http", tmp_path)
    try:
        assert o.server is not None and isinstance(o.store, SessionStore)
        o.store.touch_session("once")
        url = f"{o.server.url}/store/sessions/feedback"
        headers = {"content-type": "application/json", "idempotency-key": "k1"}
        body = {"session_id": "once", "reward": 1.0}
        first = httpx.post(url, json=body, headers=headers)
        again = httpx.post(url, json=body, headers=headers)
        assert first.status_code == again.status_code == 200
        assert first.json()["reward"] == again.json()["reward"] == 1.0
        other = httpx.post(url, json=body, headers={**headers, "idempotency-key": "k2"})
        assert other.status_code == 409 and other.json()["error"]["code"] == "session_closed"
    finally:
        o.close()
