"""Every bad call gets the same clear error from the memory, SQLite and HTTP stores, and
changes nothing; the HTTP server answers 4xx with ``{"error": {"code", "message"}}``."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from store_harness import KINDS, Opened, open_kind, snapshot

from boltrl.errors import (
    BoltrlError,
    Conflict,
    InvalidInput,
    NotFound,
    StaleAttempt,
    StoreUnavailable,
    Unauthorized,
)
from boltrl.records import Attempt, Resources, RewardEvent, Task, ToolStep
from boltrl.store import HttpStore, Store

pytestmark = pytest.mark.timeout(60)


@dataclass
class World:
    """A store with one rollout of each kind of state, and the attempts that made them."""

    store: Store
    queued: str
    running: str
    done: str
    stale_rollout: str
    live: Attempt
    finished: Attempt
    stale: Attempt


def _build(store: Store) -> World:
    done, stale_rollout, running, queued = store.enqueue(
        [Task(id=f"t{i}", input={"i": i}) for i in range(4)], max_attempts=3
    )
    finished = store.claim("w", lease_s=30.0)
    assert finished is not None and finished.rollout_id == done
    store.record(finished, [RewardEvent(id="r1", value=1.0), ToolStep(id="s1", name="x")])
    store.finish(finished, "succeeded", reward=1.0)
    stale = store.claim("w", lease_s=0.05)
    assert stale is not None and stale.rollout_id == stale_rollout
    time.sleep(0.1)
    taken = store.claim("w2", lease_s=30.0)  # takes over stale_rollout as attempt 2
    assert taken is not None and (taken.rollout_id, taken.number) == (stale_rollout, 2)
    live = store.claim("w", lease_s=30.0)
    assert live is not None and live.rollout_id == running
    store.record(live, [RewardEvent(id="r2", value=0.5)])
    return World(store, queued, running, done, stale_rollout, live, finished, stale)


@pytest.fixture(params=KINDS)
def world(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[World]:
    o = open_kind(request.param, tmp_path)
    try:
        yield _build(o.store)
    finally:
        o.close()


def _bad_calls(w: World) -> list[tuple[str, Callable[[Store], Any], type[BoltrlError], str]]:
    """(name, call, error class, text the message must contain)."""
    live = w.live
    ghost = live.model_copy(update={"rollout_id": "ro-ghost"})
    nan_reward = RewardEvent.model_construct(id="n", value=math.nan)
    return [
        ("get unknown", lambda s: s.get("ro-ghost"), NotFound, "ro-ghost"),
        ("get empty id", lambda s: s.get(""), NotFound, "unknown rollout"),
        ("record unknown rollout", lambda s: s.record(ghost, []), NotFound, "ro-ghost"),
        (
            "record unknown attempt",
            lambda s: s.record(live.model_copy(update={"number": 9}), []),
            NotFound,
            "no attempt 9",
        ),
        (
            "record malformed field",
            lambda s: s.record(
                live, [ToolStep(id="ok", name="x"), {"kind": "reward", "value": "x"}]
            ),
            InvalidInput,
            "records[1].value",
        ),
        (
            "record unknown kind",
            lambda s: s.record(live, [{"kind": "weird"}]),
            InvalidInput,
            "records[0]",
        ),
        (
            "record missing field",
            lambda s: s.record(live, [{"kind": "tool_step"}]),
            InvalidInput,
            "records[0].name",
        ),
        (
            "record other rollout",
            lambda s: s.record(live, [ToolStep(id="o", name="x", rollout_id=w.done)]),
            InvalidInput,
            "records[0].rollout_id",
        ),
        (
            "record other attempt",
            lambda s: s.record(live, [ToolStep(id="o", name="x", attempt=2)]),
            InvalidInput,
            "records[0].attempt",
        ),
        (
            "record nan reward",
            lambda s: s.record(live, [nan_reward]),
            InvalidInput,
            "records[0].value",
        ),
        ("record not a list", lambda s: s.record(live, "abc"), InvalidInput, "records"),
        (
            "finish nan reward",
            lambda s: s.finish(live, "succeeded", reward=math.nan),
            InvalidInput,
            "reward",
        ),
        (
            "finish inf reward",
            lambda s: s.finish(live, "succeeded", reward=math.inf),
            InvalidInput,
            "reward",
        ),
        ("finish bad status", lambda s: s.finish(live, "bogus"), InvalidInput, "status"),
        ("finish as running", lambda s: s.finish(live, "running"), InvalidInput, "status"),
        (
            "finish twice, another outcome",
            lambda s: s.finish(w.finished, "failed"),
            StaleAttempt,
            "already ended (succeeded)",
        ),
        (
            "stale finish",
            lambda s: s.finish(w.stale, "succeeded", reward=1.0),
            StaleAttempt,
            "attempt 2 took over",
        ),
        ("stale heartbeat", lambda s: s.heartbeat(w.stale), StaleAttempt, "lease_expired"),
        ("heartbeat finished", lambda s: s.heartbeat(w.finished), StaleAttempt, "already ended"),
        (
            "heartbeat bad lease",
            lambda s: s.heartbeat(live, lease_s=-1),
            InvalidInput,
            "lease_s",
        ),
        (
            "enqueue max_attempts",
            lambda s: s.enqueue([Task(input={})], max_attempts=0),
            InvalidInput,
            "max_attempts",
        ),
        (
            "enqueue timeout",
            lambda s: s.enqueue([Task(input={})], timeout_s=math.nan),
            InvalidInput,
            "timeout_s",
        ),
        (
            "enqueue bad task",
            lambda s: s.enqueue([Task(input={}), {"input": "text"}]),
            InvalidInput,
            "tasks[1].input",
        ),
        ("enqueue not a list", lambda s: s.enqueue(Task(input={})), InvalidInput, "tasks"),
        ("claim lease", lambda s: s.claim("w", lease_s=0), InvalidInput, "lease_s"),
        ("claim wait", lambda s: s.claim("w", wait_s=-1), InvalidInput, "wait_s"),
        ("claim worker", lambda s: s.claim(""), InvalidInput, "worker_id"),
        ("query status", lambda s: s.query(status="bogus"), InvalidInput, "status"),
        ("query limit", lambda s: s.query(limit=-1), InvalidInput, "limit"),
        ("count status", lambda s: s.count(status="nope"), InvalidInput, "status"),
        ("wait unknown", lambda s: s.wait([w.done, "ro-ghost"], 5.0), NotFound, "ro-ghost"),
        ("wait timeout", lambda s: s.wait([w.done], -1), InvalidInput, "timeout_s"),
        ("current of queued", lambda s: s.current_attempt(w.queued), Conflict, "not running"),
        ("current unknown", lambda s: s.current_attempt("ro-ghost"), NotFound, "ro-ghost"),
        ("cancel unknown", lambda s: s.cancel("ro-ghost"), NotFound, "ro-ghost"),
        ("cancel finished", lambda s: s.cancel(w.done), Conflict, "already succeeded"),
        ("publish junk", lambda s: s.publish_resources({"x": 1}), InvalidInput, "resources"),
        (
            "publish NaN sampling",
            lambda s: s.publish_resources(Resources(sampling={"temperature": math.nan})),
            InvalidInput,
            "resources.sampling.temperature",
        ),
        (
            "finish unreadable error",
            lambda s: s.finish(live, "failed", error="bad \ud800 text"),
            InvalidInput,
            "error",
        ),
    ]


def test_bad_calls_raise_clear_errors_and_change_nothing(world: World) -> None:
    store = world.store
    before = snapshot(store)
    for name, call, cls, text in _bad_calls(world):
        with pytest.raises(cls) as info:
            call(store)
        assert type(info.value) is cls, name  # the exact class, over HTTP too
        assert text in str(info.value), (name, str(info.value))
        assert snapshot(store) == before, f"{name} changed the store"
    # And the good calls still work afterwards.
    store.record(world.live, [ToolStep(id="ok", name="x")])
    assert store.finish(world.live, "succeeded", reward=2.0).reward == 2.0


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Opened]:
    o = open_kind("http", tmp_path, token="s3cret")
    try:
        yield o
    finally:
        o.close()


def test_http_wrong_token_is_401_and_changes_nothing(served: Opened) -> None:
    assert served.server is not None and served.backing is not None
    served.store.enqueue([Task(input={})])
    before = snapshot(served.backing)
    for token in (None, "wrong"):
        with HttpStore(served.server.url, token, retries=0) as bad:
            with pytest.raises(Unauthorized, match="token"):
                bad.enqueue([Task(input={})])
            with pytest.raises(Unauthorized):
                bad.claim("w")
    raw = httpx.post(f"{served.server.url}/store/claim", json={"worker_id": "w", "lease_s": 5})
    assert raw.status_code == 401
    assert raw.json() == {
        "error": {"code": "unauthorized", "message": raw.json()["error"]["message"]}
    }
    assert snapshot(served.backing) == before


def test_http_errors_are_4xx_json(served: Opened) -> None:
    assert served.server is not None and served.backing is not None
    url = f"{served.server.url}/store"
    auth = {"Authorization": "Bearer s3cret"}
    [rid] = served.store.enqueue([Task(input={})])
    before = snapshot(served.backing)
    cases: list[tuple[str, str, Any, int, str, str]] = [
        ("POST", "/claim", b"{not json", 400, "invalid_input", "body"),
        ("POST", "/claim", {"lease_s": 5}, 400, "invalid_input", "worker_id"),
        (
            "POST",
            "/finish",
            {"attempt": {"rollout_id": rid}, "status": "succeeded"},
            400,
            "invalid_input",
            "attempt.number",
        ),
        ("POST", "/rollouts", {"tasks": [{"input": 3}]}, 400, "invalid_input", "tasks[0].input"),
        ("GET", "/rollouts?limit=abc", None, 400, "invalid_input", "limit"),
        ("GET", "/rollouts/ro-ghost", None, 404, "not_found", "ro-ghost"),
        ("GET", "/no-such-route", None, 404, "not_found", "Not Found"),
        ("POST", "/wait", {"ids": [rid], "timeout_s": "x"}, 400, "invalid_input", "timeout_s"),
    ]
    for method, path, body, status, code, text in cases:
        kw: dict[str, Any] = {"content": body} if isinstance(body, bytes) else {"json": body}
        headers = {**auth, "content-type": "application/json"}  # declared JSON, not parseable
        resp = httpx.request(method, url + path, headers=headers, **kw)
        assert resp.status_code == status, (path, resp.text)
        err = resp.json()["error"]
        assert err["code"] == code and text in err["message"], (path, err)
    assert snapshot(served.backing) == before


def test_http_retries_then_reports_unavailable(tmp_path: Path) -> None:
    # Nothing listens on this port once the server stopped: connection refused.
    o = open_kind("http", tmp_path)
    assert o.server is not None
    url = o.server.url
    o.close()
    with HttpStore(url, retries=2, backoff_s=0.01) as client:
        t0 = time.monotonic()
        with pytest.raises(StoreUnavailable, match="could not reach"):
            client.count()
        assert time.monotonic() - t0 >= 0.01  # it backed off before giving up


def test_http_retry_with_idempotency_key_acts_once(served: Opened) -> None:
    """A retried mutating request (same key) gets the first answer, not a second effect."""
    assert served.server is not None and served.backing is not None
    url = f"{served.server.url}/store/rollouts"
    headers = {"Authorization": "Bearer s3cret", "Idempotency-Key": "k-1"}
    body = {"tasks": [{"input": {"a": 1}}]}
    first = httpx.post(url, json=body, headers=headers)
    again = httpx.post(url, json=body, headers=headers)
    assert first.status_code == again.status_code == 200
    assert first.json() == again.json()
    assert served.backing.count() == 1
