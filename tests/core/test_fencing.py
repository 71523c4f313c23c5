"""Fencing (issue 15 items 1 and 2): nothing from an attempt that is not current reaches a
rollout — not a forged ``Attempt``, not a replaced attempt's late model call or record,
not a thread left behind by an earlier rollout, not a thread writing after its rollout
finished — and lease tokens never show in what the store hands out."""

from __future__ import annotations

import re
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from gateway_util import client, running, serve
from store_harness import KINDS, Opened, open_kind, snapshot

import boltrl
from boltrl import LLM, RolloutStatus, Runner, Task
from boltrl.errors import StaleAttempt
from boltrl.records import Attempt, AttemptOutcome, Resources, RewardEvent, ToolStep
from boltrl.runner import copy_context_thread
from boltrl.store import MemoryStore, Store
from boltrl.testing import ScriptedBackend

pytestmark = pytest.mark.timeout(60)

MSG = [{"role": "user", "content": "hi"}]


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


def _forged(real: Attempt, token: str | None) -> Attempt:
    """An Attempt nobody claimed: right rollout and number, made up (or no) token."""
    return Attempt(
        rollout_id=real.rollout_id,
        number=real.number,
        worker_id="intruder",
        started_at=real.started_at,
        lease_expires_at=real.lease_expires_at,
        last_heartbeat=real.last_heartbeat,
        token=token,
    )


def test_claims_issue_distinct_unguessable_tokens_that_reads_never_show(store: Store) -> None:
    ids = store.enqueue([Task(input={"i": i}) for i in range(2)])
    a, b = store.claim("w"), store.claim("w")
    assert a is not None and b is not None
    for att in (a, b):
        assert att.token is not None and re.fullmatch(r"[A-Za-z0-9_-]{32}", att.token)
    assert a.token != b.token
    beat = store.heartbeat(a)
    assert beat.token == a.token  # the worker keeps it across heartbeats
    done = store.finish(beat, "succeeded", reward=1.0)
    reads: list[Any] = [
        done,
        store.current_attempt(b.rollout_id),
        *store.query(),
        *store.wait(ids, 0.0),
        *(store.get(i) for i in ids),
    ]
    text = " ".join(r.model_dump_json() for r in reads)
    assert a.token not in text and b.token not in text
    assert all(att.token is None for r in reads if hasattr(r, "attempts") for att in r.attempts)


@pytest.mark.parametrize("token", [None, "", "x" * 32])
def test_an_attempt_nobody_claimed_cannot_touch_a_running_rollout(
    store: Store, token: str | None
) -> None:
    [real] = running(store)
    forged = _forged(real, token)
    before = snapshot(store)
    rid = real.rollout_id
    for action, call in [
        ("heartbeat", lambda: store.heartbeat(forged)),
        ("record", lambda: store.record(forged, [RewardEvent(value=9.0)])),
        ("finish", lambda: store.finish(forged, "succeeded", reward=9.0)),
    ]:
        with pytest.raises(StaleAttempt) as e:
            call()
        assert type(e.value) is StaleAttempt
        message = str(e.value)
        assert f"cannot {action}: attempt 1 of rollout {rid!r}" in message, message
        assert "lease token" in message
        assert snapshot(store) == before, action
    # The worker that claimed it is unaffected.
    store.record(real, [RewardEvent(value=1.0)])
    assert store.finish(real, "succeeded", reward=1.0).status is RolloutStatus.SUCCEEDED


def test_a_replaced_attempt_cannot_record_and_records_after_finish_are_refused(
    store: Store,
) -> None:
    [rid] = store.enqueue([Task(input={})], max_attempts=2)
    a1 = store.claim("w1")
    assert a1 is not None
    store.finish(a1, "failed", error="slow", error_kind="timeout", retryable=True)
    a2 = store.claim("w2")
    assert a2 is not None and a2.number == 2
    with pytest.raises(StaleAttempt, match=r"attempt 1 of rollout .* already ended"):
        store.record(a1, [ToolStep(id="late", name="t")])
    store.record(a2, [ToolStep(id="mine", name="t")])
    store.finish(a2, "succeeded", reward=1.0)
    with pytest.raises(StaleAttempt, match=r"attempt 2 of rollout .* already ended"):
        store.record(a2, [ToolStep(id="after", name="t")])
    assert [(t.id, t.attempt) for t in store.get(rid).tool_steps] == [("mine", 2)]


def test_a_retried_finish_that_committed_answers_success(store: Store) -> None:
    [att] = running(store)
    first = store.finish(att, "succeeded", reward=0.5)
    again = store.finish(att, "succeeded", reward=0.5)
    assert again == first and again.status is RolloutStatus.SUCCEEDED
    with pytest.raises(StaleAttempt, match=r"already ended \(succeeded\)"):
        store.finish(att, "failed", error="late")


def test_gateway_refuses_a_replaced_attempts_call_and_files_nothing_under_the_new_one() -> None:
    """The late call of a timed-out attempt used to be filed under its replacement."""
    store = MemoryStore()
    with serve(ScriptedBackend(["a", "b", "c"]), store) as gw:
        [rid] = store.enqueue([Task(input={})], max_attempts=2)
        a1 = store.claim("w1")
        assert a1 is not None
        store.finish(a1, "failed", error="slow", error_kind="timeout", retryable=True)
        a2 = store.claim("w2")
        assert a2 is not None
        late = httpx.post(f"{gw.rollout_url(a1)}/chat/completions", json={"messages": MSG})
        assert late.status_code == 409, late.text
        error = late.json()["error"]
        assert error["code"] == "stale_attempt" and rid in error["message"]
        assert "attempt 1" in error["message"] and "not recorded" in error["message"]
        # A forged token for the current attempt number: generated, then refused.
        forged = _forged(a2, "f" * 32)
        r = httpx.post(f"{gw.rollout_url(forged)}/responses", json={"input": "x"})
        assert r.status_code == 409 and r.json()["error"]["code"] == "stale_attempt", r.text
        # The tokenless rollout route records nothing for a running rollout.
        r = httpx.post(f"{gw.rollout_url(rid)}/chat/completions", json={"messages": MSG})
        assert r.status_code == 409, r.text
        assert r.json()["error"]["code"] == "attempt_token_required"
        assert store.get(rid).calls == []
        ok = client(gw.rollout_url(a2)).chat.completions.create(model="m", messages=MSG)
        [call] = store.get(rid).calls
        assert (call.id, call.attempt) == (ok.id, 2)
        assert a2.token is not None and a2.token not in store.get(rid).model_dump_json()
    store.close()


def test_runner_timed_out_agents_late_call_is_not_training_data() -> None:
    """End to end: attempt 1 times out, keeps running, calls the model after attempt 2
    took over; the rollout holds attempt 2's call only."""
    store = MemoryStore()
    late_status: list[int] = []
    second_called, late_done = threading.Event(), threading.Event()

    def agent(task: dict[str, Any], llm: LLM) -> float:
        if "/attempts/1/" in llm.base_url:
            # Past timeout_s: abandoned and requeued; calls once attempt 2 is running.
            second_called.wait(10)
            r = httpx.post(f"{llm.base_url}/chat/completions", json={"messages": MSG})
            late_status.append(r.status_code)
            late_done.set()
            return 0.0
        client(llm.base_url).chat.completions.create(model="m", messages=MSG)
        second_called.set()
        late_done.wait(10)  # still running when attempt 1's late call arrives
        return 1.0

    with serve(ScriptedBackend(["served first", "served second"]), store) as gw:
        store.publish_resources(Resources(gateway_url=gw.url, model="m"))
        [rid] = store.enqueue([Task(input={})], max_attempts=2, timeout_s=1.0)
        runner = Runner(agent, store, concurrency=2, lease_s=5.0, claim_wait_s=0.1)
        runner.run(max_rollouts=2, exit_when_idle=True)
        assert late_done.wait(10)
    r = store.get(rid)
    assert r.status is RolloutStatus.SUCCEEDED and r.reward == 1.0
    assert [a.outcome for a in r.attempts] == [AttemptOutcome.TIMEOUT, AttemptOutcome.SUCCEEDED]
    assert late_status == [409]
    assert [(c.attempt, c.response["message"]["content"]) for c in r.calls] == [(2, "served first")]
    store.close()


def test_a_plain_thread_left_by_one_rollout_cannot_reward_the_next() -> None:
    store = MemoryStore()
    go, wrote = threading.Event(), threading.Event()
    outcome: list[Any] = []

    def leftover() -> None:
        go.wait(10)
        outcome.append(boltrl.emit_reward(5.0, "leaked"))
        wrote.set()

    def agent(task: dict[str, Any], llm: LLM) -> float:
        if task["name"] == "a":
            # A plain thread started during the rollout reaches it (the only one active).
            def inside() -> None:
                outcome.append(boltrl.emit_reward(0.5, "own"))

            t = threading.Thread(target=inside)
            t.start()
            t.join()
            threading.Thread(target=leftover, daemon=True).start()
            return 0.0
        go.set()
        assert wrote.wait(10)
        return 1.0

    [ra, rb] = store.enqueue([Task(input={"name": "a"}), Task(input={"name": "b"})])
    with warnings.catch_warnings():  # "outside a rollout", once per process
        warnings.simplefilter("ignore", RuntimeWarning)
        Runner(agent, store, concurrency=1, claim_wait_s=0.1).run(
            max_rollouts=2, exit_when_idle=True
        )
    a, b = store.get(ra), store.get(rb)
    assert [(e.name, e.value) for e in a.rewards] == [("own", 0.5)]
    assert b.rewards == [] and b.status is RolloutStatus.SUCCEEDED
    assert outcome[1] is None  # the leftover thread's reward went nowhere
    store.close()


def test_a_context_copying_thread_cannot_write_after_its_rollout_finished() -> None:
    store = MemoryStore()
    go, wrote = threading.Event(), threading.Event()

    def later() -> None:
        go.wait(10)
        boltrl.emit_reward(7.0, "after")
        boltrl.record_tool_step("after")
        wrote.set()

    def agent(task: dict[str, Any], llm: LLM) -> float:
        boltrl.emit_reward(0.25, "during")
        copy_context_thread(later).start()
        return 1.0

    [rid] = store.enqueue([Task(input={})])
    Runner(agent, store, concurrency=1, claim_wait_s=0.1).run(max_rollouts=1, exit_when_idle=True)
    assert store.get(rid).status is RolloutStatus.SUCCEEDED
    go.set()
    assert wrote.wait(10)
    r = store.get(rid)
    assert [(e.name, e.value) for e in r.rewards] == [("during", 0.25)]
    assert r.tool_steps == []
    store.close()


def test_the_dashboard_beside_a_live_sqlite_store_does_not_show_lease_tokens(
    tmp_path: Path,
) -> None:
    from boltrl.dashboard import create_dashboard_app
    from boltrl.dashboard.source import open_source
    from boltrl.store import SqliteStore
    from boltrl.store.server import RunningServer

    path = tmp_path / "live.db"
    store = SqliteStore(path)
    [rid] = store.enqueue([Task(input={})])
    att = store.claim("w")  # running: its token sits in the raw head the dashboard reads
    assert att is not None and att.token is not None
    source, _ = open_source(f"sqlite:///{path}")
    app = create_dashboard_app(source, poll_s=0.1)
    server = RunningServer(app)
    try:
        for route in (f"/api/rollouts/{rid}", "/api/rollouts", "/api/workers"):
            r = httpx.get(f"{server.url}{route}", timeout=30)
            assert r.status_code == 200, (route, r.text)
            assert att.token not in r.text, route
    finally:
        app.state.dashboard.close()
        server.stop()
        store.close()
