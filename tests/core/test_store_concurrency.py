"""Eight runner-like worker threads over 500 rollouts with injected failures (retryable
exceptions, abandoned attempts whose leases expire, hard failures): every rollout ends
succeeded or failed with exactly the attempts its plan implies; none is lost, none runs
twice at once (a finish would then be stale), no attempt is claimed twice, and every
attempt keeps its own records."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from store_harness import KINDS, Opened, open_kind

from boltrl.records import Attempt, AttemptOutcome, RewardEvent, RolloutStatus, Task, ToolStep

pytestmark = pytest.mark.timeout(120)

N_ROLLOUTS = 500
N_WORKERS = 8
MAX_ATTEMPTS = 3

Out = AttemptOutcome


def plan(i: int) -> list[str]:
    """What attempt 1, 2, 3 of task ``i`` does: ok | retry | fail | expire."""
    if i % 25 == 3:
        return ["retry", "retry", "retry"]  # exhausts max_attempts → failed
    if i % 25 == 4:
        return ["expire", "retry", "expire"]  # → failed (lease expired on the last)
    return [
        ["retry", "ok"],
        ["expire", "ok"],
        ["fail"],
        ["expire", "expire", "ok"],
        ["ok"],
        ["ok"],
        ["ok"],
        ["ok"],
        ["ok"],
        ["ok"],
    ][i % 10]


def expected(i: int) -> tuple[RolloutStatus, list[AttemptOutcome]]:
    outcome = {
        "ok": Out.SUCCEEDED,
        "retry": Out.FAILED,
        "fail": Out.FAILED,
        "expire": Out.LEASE_EXPIRED,
    }
    steps = plan(i)
    status = RolloutStatus.SUCCEEDED if steps[-1] == "ok" else RolloutStatus.FAILED
    return status, [outcome[s] for s in steps]


@pytest.fixture(params=KINDS)
def opened(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opened]:
    o = open_kind(request.param, tmp_path)
    try:
        yield o
    finally:
        o.close()


def test_workers_over_500_rollouts_with_injected_failures(opened: Opened) -> None:
    store = opened.store
    tasks = [Task(id=f"t{i}", input={"i": i}) for i in range(N_ROLLOUTS)]
    ids = store.enqueue(tasks, max_attempts=MAX_ATTEMPTS)
    claims: list[tuple[str, int]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    stop = threading.Event()

    def run_attempt(att: Attempt) -> None:
        assert att.task is not None
        i = att.task.input["i"]
        step = plan(i)[att.number - 1]
        store.record(
            att,
            [
                ToolStep(id=f"tool-{i}", name="work", arguments={"n": att.number}),
                RewardEvent(id=f"rew-{i}", value=float(att.number)),
            ],
        )
        if step == "ok":
            store.finish(att, "succeeded", reward=float(i))
        elif step == "retry":
            store.finish(att, "failed", error="flaky", error_kind="exception", retryable=True)
        elif step == "fail":
            store.finish(att, "failed", error="broken", error_kind="exception")
        else:  # "expire": a worker that dies silently; shorten the lease so the test is fast
            store.heartbeat(att, lease_s=0.05)

    def worker(w: int) -> None:
        # Any error — a StaleAttempt from finish would mean two attempts overlapped —
        # stops the test and is reported below.
        try:
            while not stop.is_set():
                att = store.claim(f"w{w}", lease_s=30.0, wait_s=0.2)
                if att is None:
                    continue
                with lock:
                    claims.append((att.rollout_id, att.number))
                run_attempt(att)
        except BaseException as e:
            errors.append(e)
            stop.set()

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(N_WORKERS)]
    for t in threads:
        t.start()
    try:
        done = store.wait(ids, timeout_s=90.0)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads)

    # No attempt claimed twice, and the claims are exactly the attempts the store holds.
    assert len(claims) == len(set(claims))
    assert sorted(claims) == sorted((r.id, a.number) for r in done for a in r.attempts)
    assert [r.id for r in done] == ids and store.count() == N_ROLLOUTS
    counts: Counter[RolloutStatus] = Counter()
    for i, r in enumerate(done):
        status, outcomes = expected(i)
        assert (r.status, [a.outcome for a in r.attempts]) == (status, outcomes), (i, r)
        assert [a.number for a in r.attempts] == list(range(1, len(outcomes) + 1))
        assert r.reward == (float(i) if status is RolloutStatus.SUCCEEDED else None)
        # Each attempt's records, once each, under its own number.
        assert [(t.attempt, t.arguments) for t in r.tool_steps] == [
            (n, {"n": n}) for n in range(1, len(outcomes) + 1)
        ]
        assert [(e.attempt, e.value) for e in r.rewards] == [
            (n, float(n)) for n in range(1, len(outcomes) + 1)
        ]
        counts[r.status] += 1
    assert counts[RolloutStatus.SUCCEEDED] + counts[RolloutStatus.FAILED] == N_ROLLOUTS
    assert store.count(status="succeeded") == counts[RolloutStatus.SUCCEEDED]
    assert store.count(status="failed") == counts[RolloutStatus.FAILED]
