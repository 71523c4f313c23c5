"""The Store contract, one suite over the memory, SQLite and HTTP stores: lifecycle,
leases and retries, separate and idempotent records, query/count/wait, resources,
cancellation, and opening stores by URL."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from store_harness import KINDS, Opened, open_kind

from boltrl.errors import Conflict, InvalidInput, StaleAttempt
from boltrl.records import (
    AttemptOutcome,
    CallAnnotation,
    LLMCall,
    Resources,
    RewardEvent,
    RolloutStatus,
    Task,
    ToolStep,
)
from boltrl.store import HttpStore, MemoryStore, SqliteStore, Store, open_store

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(params=KINDS)
def opened(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opened]:
    o = open_kind(request.param, tmp_path)
    try:
        yield o
    finally:
        o.close()


@pytest.fixture
def store(opened: Opened) -> Store:
    return opened.store


def _task(i: int) -> Task:
    return Task(id=f"t{i}", input={"i": i}, group="g", split="train", metadata={"m": i})


def test_implementations_satisfy_the_protocol(store: Store) -> None:
    assert isinstance(store, Store)


def test_full_lifecycle_with_records_joined_and_ordered(store: Store) -> None:
    ids = store.enqueue([_task(0), _task(1)], max_attempts=2, timeout_s=9.0)
    assert [r.status for r in store.query()] == [RolloutStatus.QUEUED] * 2

    att = store.claim("w1", lease_s=5.0)
    assert att is not None
    assert (att.rollout_id, att.number, att.worker_id) == (ids[0], 1, "w1")  # oldest first
    assert att.task == _task(0) and att.timeout_s == 9.0
    assert att.outcome is AttemptOutcome.RUNNING
    assert att.lease_expires_at == pytest.approx(att.started_at + 5.0)
    assert store.current_attempt(ids[0]) == att.model_copy(
        update={"task": None, "timeout_s": None, "token": None}
    )

    time.sleep(0.01)
    beat = store.heartbeat(att)
    assert beat.task == att.task and beat.last_heartbeat > att.last_heartbeat
    assert beat.lease_expires_at == pytest.approx(beat.last_heartbeat + 5.0)  # same length

    call = LLMCall(
        id="chatcmpl-1",
        rollout_id=ids[0],
        attempt=1,
        request={"messages": []},
        prompt_token_ids=[1, 2],
        response_token_ids=[3],
        response_logprobs=[-0.5],
    )
    ann = CallAnnotation(id="ann-1", call_id="chatcmpl-1", agent="planner", parent_id="root")
    tool = ToolStep(id="tool-1", name="calc", arguments={"x": 1}, result=2)
    reward = RewardEvent(id="rew-1", value=0.5, index=3)
    store.record(beat, [call, ann])
    store.record(beat, [tool, reward])

    done = store.finish(beat, RolloutStatus.SUCCEEDED, reward=1.0)
    assert done.status is RolloutStatus.SUCCEEDED and done.reward == 1.0 and done.error is None
    got = store.get(ids[0])
    assert got == done
    assert got.task == _task(0) and got.max_attempts == 2 and got.timeout_s == 9.0
    assert got.finished_at is not None and got.finished_at >= got.created_at
    [a1] = got.attempts
    assert a1 == beat.model_copy(
        update={
            "task": None,
            "timeout_s": None,
            "token": None,
            "outcome": AttemptOutcome.SUCCEEDED,
            "ended_at": a1.ended_at,
        }
    )
    seqs = [r.seq for r in (*got.calls, *got.annotations, *got.tool_steps, *got.rewards)]
    assert seqs == sorted(seqs) and len(set(seqs)) == 4 and seqs[0] > 0
    stamp = {"rollout_id": ids[0], "attempt": 1}
    assert got.calls == [
        call.model_copy(update={"seq": seqs[0], "agent": "planner", "parent_id": "root"})
    ]
    assert got.annotations == [ann.model_copy(update={**stamp, "seq": seqs[1]})]
    assert got.tool_steps == [tool.model_copy(update={**stamp, "seq": seqs[2]})]
    assert got.rewards == [reward.model_copy(update={**stamp, "seq": seqs[3]})]
    assert got.unjoined_calls == 0

    assert store.get(ids[1]).status is RolloutStatus.QUEUED
    assert store.count() == 2 and store.count(status="succeeded") == 1


def test_claim_waits_on_a_condition_and_wakes_on_enqueue(store: Store) -> None:
    t0 = time.monotonic()
    assert store.claim("w", wait_s=0.0) is None
    assert store.claim("w", wait_s=0.2) is None
    assert time.monotonic() - t0 >= 0.2
    got: list[object] = []
    th = threading.Thread(target=lambda: got.append(store.claim("w", wait_s=10.0)))
    th.start()
    time.sleep(0.1)
    t1 = time.monotonic()
    [rid] = store.enqueue([_task(0)])
    th.join(5)
    assert time.monotonic() - t1 < 2.0  # woken by the enqueue, not by the 10 s timeout
    assert [getattr(a, "rollout_id", None) for a in got] == [rid]


def test_lease_expiry_requeues_until_max_attempts_then_fails(store: Store) -> None:
    [rid] = store.enqueue([_task(0)], max_attempts=2)
    a1 = store.claim("w1", lease_s=0.2)
    assert a1 is not None
    # A blocked claim wakes when the lease expires (it computes the expiry, no polling).
    t0 = time.monotonic()
    a2 = store.claim("w2", lease_s=1.0, wait_s=10.0)
    assert a2 is not None and 0.1 < time.monotonic() - t0 < 3.0
    assert (a2.rollout_id, a2.number, a2.worker_id) == (rid, 2, "w2")
    r = store.get(rid)
    assert r.status is RolloutStatus.RUNNING
    assert r.attempts[0].outcome is AttemptOutcome.LEASE_EXPIRED
    assert r.attempts[0].error_kind == "lease_expired"

    with pytest.raises(StaleAttempt, match="attempt 2 took over"):
        store.heartbeat(a1)
    with pytest.raises(StaleAttempt):
        store.finish(a1, "succeeded", reward=1.0)
    # Whatever the replaced attempt sends later is refused, never filed anywhere.
    with pytest.raises(StaleAttempt, match="attempt 2 took over"):
        store.record(a1, [ToolStep(id="late", name="t")])
    assert store.get(rid).tool_steps == []

    [done] = store.wait([rid], timeout_s=10.0)  # wait notices the second expiry itself
    assert done.status is RolloutStatus.FAILED
    assert [a.outcome for a in done.attempts] == [AttemptOutcome.LEASE_EXPIRED] * 2
    assert done.error is not None and "gave up after 2 attempt(s)" in done.error


def test_heartbeats_keep_the_lease(store: Store) -> None:
    [rid] = store.enqueue([_task(0)])
    att = store.claim("w", lease_s=0.5)
    assert att is not None
    for _ in range(8):  # 0.8 s in all: well past the lease, yet it holds
        time.sleep(0.1)
        att = store.heartbeat(att)
    assert store.get(rid).status is RolloutStatus.RUNNING
    assert store.claim("w2", wait_s=0.0) is None
    att = store.heartbeat(att, lease_s=0.05)  # an explicit lease_s changes the length
    time.sleep(0.15)
    assert store.get(rid).status is RolloutStatus.REQUEUED


def test_retryable_failures_requeue_until_max_attempts(store: Store) -> None:
    [rid, other, timed] = store.enqueue([_task(0), _task(1), _task(2)], max_attempts=3)
    for n in (1, 2, 3):
        att = store.claim("w", lease_s=5.0)
        assert att is not None and (att.rollout_id, att.number) == (rid, n)  # oldest first
        r = store.finish(att, "failed", error=f"boom {n}", error_kind="exception", retryable=True)
        assert r.status is (RolloutStatus.REQUEUED if n < 3 else RolloutStatus.FAILED)
    r = store.get(rid)
    assert [(a.number, a.outcome, a.error) for a in r.attempts] == [
        (n, AttemptOutcome.FAILED, f"boom {n}") for n in (1, 2, 3)
    ]
    assert r.error == "gave up after 3 attempt(s): boom 3" and r.reward is None

    att = store.claim("w", lease_s=5.0)
    assert att is not None and att.rollout_id == other
    r = store.finish(att, "failed", error="bad", error_kind="exception")  # not retryable
    assert (r.status, len(r.attempts), r.error) == (RolloutStatus.FAILED, 1, "bad")

    att = store.claim("w", lease_s=5.0)
    assert att is not None and att.rollout_id == timed
    r = store.finish(att, "failed", error="slow", error_kind="timeout", retryable=True)
    assert r.status is RolloutStatus.REQUEUED
    assert r.attempts[0].outcome is AttemptOutcome.TIMEOUT
    att = store.claim("w", lease_s=5.0)
    assert att is not None and att.number == 2
    r = store.finish(att, "succeeded", reward=0.25)
    assert (r.status, r.reward, r.error, len(r.attempts)) == (
        RolloutStatus.SUCCEEDED,
        0.25,
        None,
        2,
    )


def test_each_attempt_keeps_its_own_records(store: Store) -> None:
    [rid] = store.enqueue([_task(0)], max_attempts=2)
    a1 = store.claim("w", lease_s=5.0)
    assert a1 is not None
    store.record(a1, [RewardEvent(id="r", value=1.0), ToolStep(id="t", name="x")])
    store.finish(a1, "failed", error="e", retryable=True)
    a2 = store.claim("w", lease_s=5.0)
    assert a2 is not None
    store.record(a2, [RewardEvent(id="r", value=2.0)])  # same id, other attempt: kept apart
    store.finish(a2, "succeeded")
    r = store.get(rid)
    assert [(e.attempt, e.value) for e in r.rewards] == [(1, 1.0), (2, 2.0)]
    assert [(e.attempt, e.value) for e in r.records_of(2).rewards] == [(2, 2.0)]
    assert r.records_of(2).tool_steps == [] and len(r.records_of(1).tool_steps) == 1


def test_record_is_idempotent_by_id_first_write_wins(store: Store) -> None:
    [rid] = store.enqueue([_task(0)])
    att = store.claim("w", lease_s=5.0)
    assert att is not None
    first = [RewardEvent(id="a", value=1.0), ToolStep(id="b", name="x")]
    store.record(att, first)
    before = store.get(rid)
    store.record(att, first)  # a retry
    store.record(
        att,
        [
            RewardEvent(id="a", value=9.0),
            RewardEvent(id="c", value=3.0),
            RewardEvent(id="c", value=4.0),
        ],
    )
    after = store.get(rid)
    assert after.tool_steps == before.tool_steps
    assert [(e.id, e.value, e.seq) for e in after.rewards] == [
        ("a", 1.0, before.rewards[0].seq),
        ("c", 3.0, after.rewards[1].seq),
    ]
    assert after.rewards[1].seq > before.tool_steps[0].seq


def test_query_count_and_wait(store: Store) -> None:
    ids = store.enqueue([_task(i) for i in range(5)])
    assert [r.id for r in store.query()] == ids
    assert [r.id for r in store.query(limit=2, offset=1)] == ids[1:3]
    assert store.query(limit=0) == [] and store.query(offset=5) == []
    assert all(r.calls == [] and r.attempts == [] for r in store.query())
    a = store.claim("w", lease_s=5.0)
    b = store.claim("w", lease_s=5.0)
    assert a is not None and b is not None
    store.finish(a, "succeeded", reward=1.0)
    assert store.count() == 5
    assert store.count(status=RolloutStatus.SUCCEEDED) == 1
    assert store.count(status="running") == 1 and store.count(status="queued") == 3
    assert [r.id for r in store.query(status="queued")] == ids[2:]
    assert [r.id for r in store.query(status=RolloutStatus.RUNNING)] == [ids[1]]

    # wait: times out with the rollouts as they stand, or returns once all are terminal.
    t0 = time.monotonic()
    got = store.wait([ids[0], ids[1]], timeout_s=0.2)
    assert time.monotonic() - t0 >= 0.2
    assert [(r.id, r.status) for r in got] == [
        (ids[0], RolloutStatus.SUCCEEDED),
        (ids[1], RolloutStatus.RUNNING),
    ]
    threading.Timer(0.2, lambda: store.finish(b, "succeeded", reward=0.5)).start()
    t0 = time.monotonic()
    got = store.wait([ids[1], ids[0]], timeout_s=10.0)
    assert time.monotonic() - t0 < 5.0
    assert [(r.id, r.status, r.reward) for r in got] == [
        (ids[1], RolloutStatus.SUCCEEDED, 0.5),
        (ids[0], RolloutStatus.SUCCEEDED, 1.0),
    ]
    assert store.wait([], timeout_s=1.0) == []


def test_cancel(store: Store) -> None:
    [queued, running, done] = store.enqueue([_task(0), _task(1), _task(2)])
    r = store.cancel(queued)
    assert (r.status, r.error) == (RolloutStatus.CANCELLED, "cancelled")
    att = store.claim("w", lease_s=5.0)
    assert att is not None and att.rollout_id == running  # the cancelled one is skipped
    r = store.cancel(running)
    assert r.status is RolloutStatus.CANCELLED
    assert r.attempts[0].outcome is AttemptOutcome.CANCELLED
    with pytest.raises(StaleAttempt, match="cancelled"):
        store.heartbeat(att)  # the runner learns on its next heartbeat
    with pytest.raises(StaleAttempt):
        store.finish(att, "succeeded")
    assert store.cancel(running) == store.get(running)  # cancelling again: no change
    att = store.claim("w", lease_s=5.0)
    assert att is not None and att.rollout_id == done
    store.finish(att, "succeeded")
    with pytest.raises(Conflict, match="already succeeded"):
        store.cancel(done)
    assert store.count(status="cancelled") == 2
    [c] = store.wait([queued], timeout_s=1.0)
    assert c.status is RolloutStatus.CANCELLED


def test_publish_resources(store: Store) -> None:
    assert store.resources() == Resources()
    r1 = store.publish_resources(Resources(gateway_url="http://127.0.0.1:9", policy_version=3))
    assert r1.version == 1 and r1.policy_version == 3
    r2 = store.publish_resources(r1.model_copy(update={"policy_version": 4, "version": 77}))
    assert r2.version == 2 and r2.policy_version == 4  # the store numbers versions
    assert store.resources() == r2


def test_workers_view(store: Store) -> None:
    ids = store.enqueue([_task(0), _task(1)])
    a = store.claim("wa", lease_s=5.0)
    assert store.claim("wb", lease_s=5.0) is not None
    assert a is not None
    store.finish(a, "succeeded")
    workers = {w.worker_id: w for w in store.workers()}  # type: ignore[attr-defined]
    assert workers["wa"].running == [] and workers["wb"].running == [ids[1]]
    assert workers["wa"].last_seen > 0


def test_sqlite_reopen_restores_everything(tmp_path: Path) -> None:
    path = tmp_path / "x.db"
    with SqliteStore(path) as st:
        ids = st.enqueue([_task(0), _task(1), _task(2)], max_attempts=2)
        a = st.claim("w", lease_s=30.0)
        b = st.claim("w", lease_s=0.1)
        assert a is not None and b is not None
        st.record(a, [RewardEvent(id="r", value=1.0)])
        st.publish_resources(Resources(gateway_url="http://x", policy_version=2))
        before = [st.get(i) for i in ids]
    with pytest.raises(Conflict, match="already open"):
        with SqliteStore(path), SqliteStore(path):
            pass
    with SqliteStore(path) as st:
        assert [st.get(i) for i in ids] == before
        assert st.resources().policy_version == 2 and st.resources().version == 1
        st.record(a, [RewardEvent(id="r2", value=2.0)])  # the old attempt lives on
        assert st.heartbeat(a).number == 1
        time.sleep(0.15)  # b's lease ran out while "down": requeued, and claimable again
        c = st.claim("w", lease_s=5.0)
        assert c is not None and (c.rollout_id, c.number) == (ids[1], 2)
        d = st.claim("w", lease_s=5.0)
        assert d is not None and d.rollout_id == ids[2]
        assert st.enqueue([_task(3)]) and [r.id for r in st.query()][:3] == ids


def test_sqlite_reopen_after_everything_finished_keeps_enqueueing(tmp_path: Path) -> None:
    path = tmp_path / "x.db"
    with SqliteStore(path) as st:
        first = st.enqueue([_task(0), _task(1)])
        while (att := st.claim("w", lease_s=5.0)) is not None:
            st.finish(att, "succeeded")
    with SqliteStore(path) as st:
        later = st.enqueue([_task(2)])
        assert [r.id for r in st.query()] == first + later
        att = st.claim("w", lease_s=5.0)
        assert att is not None and att.rollout_id == later[0]


def test_open_store_urls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    mem = open_store("memory://")
    assert isinstance(mem, MemoryStore)
    mem.close()
    rel = open_store("sqlite:///sub/rel.db")
    assert isinstance(rel, SqliteStore) and (tmp_path / "sub" / "rel.db").exists()
    rel.close()
    absolute = open_store(f"sqlite:///{tmp_path}/abs.db?synchronous=FULL")
    assert isinstance(absolute, SqliteStore) and (tmp_path / "abs.db").exists()
    absolute.close()
    http = open_store("http://127.0.0.1:1", token="t")
    assert isinstance(http, HttpStore)
    http.close()
    for bad, why in [
        ("redis://x", "unknown store scheme"),
        ("store.db", "not a store URL"),
        ("sqlite://x.db", "three slashes"),
        ("sqlite:///", "names no database"),
        ("sqlite:///x.db?mode=ro", "unknown SQLite option"),
        ("sqlite:///x.db?synchronous=SOMETIMES", "synchronous"),
        ("http://", "names no host"),
    ]:
        with pytest.raises(InvalidInput, match=why):
            open_store(bad)
