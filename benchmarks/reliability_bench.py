"""Reliability figures for benchmarks/README.md (issue 15), on loopback only:

- ``store-kill``: a SQLite-backed ``boltrl store serve`` is kill -9'd (and restarted on
  the same file and port) twice while 24 clients enqueue, claim, record and finish.
  Counted afterwards: acknowledged records missing from the store, tasks enqueued more
  than once, finishes that committed but were reported to the client as errors.
- ``runner-kill``: two ``boltrl runner`` processes (process isolation) share a store;
  one is kill -9'd mid-run. Every rollout must end succeeded with exactly one
  succeeded attempt, and the killed runner's worker processes must not outlive it.
- ``costs``: what process isolation adds per rollout (ms; trivial agent, one slot) and
  what fencing adds per store call (µs; the lease-token check).

    uv run python benchmarks/reliability_bench.py [store-kill|runner-kill|costs|all]

Every phase is bounded (``--seconds``); servers bind 127.0.0.1.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import timeit
from pathlib import Path
from typing import Any

from boltrl import Runner, Task
from boltrl.errors import BoltrlError
from boltrl.records import RewardEvent, RolloutStatus
from boltrl.store import HttpStore, MemoryStore, SqliteStore
from boltrl.store._engine import same_token
from boltrl.store.server import serve_in_thread

CLI = [sys.executable, "-m", "boltrl.cli"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_server(db: Path, port: int) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [*CLI, "store", "serve", "--db", str(db), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if "serving" not in line:
        raise RuntimeError(f"store server did not start: {line}")
    return proc


# -- kill -9 of the store server under 24 clients ----------------------------------------


class Ledger:
    """What the clients were told succeeded (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.tasks: list[str] = []
        self.records: dict[str, str] = {}  # record id -> rollout id
        self.finished: set[str] = set()  # "rollout#attempt" acknowledged
        self.finish_errors: dict[str, str] = {}  # "rollout#attempt" -> error
        self.other_errors: list[str] = []


def _client(url: str, i: int, until: float, ledger: Ledger) -> None:
    store = HttpStore(url, retries=10, backoff_s=0.1, max_backoff_s=1.0, timeout_s=10.0)
    n = 0
    try:
        while time.monotonic() < until:
            n += 1
            tid = f"c{i}-{n}"
            try:
                store.enqueue([Task(id=tid, input={"i": i, "n": n})], timeout_s=60.0)
                with ledger.lock:
                    ledger.tasks.append(tid)
                att = store.claim(f"client-{i}", lease_s=5.0, wait_s=1.0)
                if att is None:
                    continue
                for k in range(3):
                    rid = f"r-{att.rollout_id[-8:]}-{att.number}-{k}"
                    store.record(att, [RewardEvent(id=rid, value=float(k))])
                    with ledger.lock:
                        ledger.records[rid] = att.rollout_id
            except BoltrlError as e:
                with ledger.lock:
                    ledger.other_errors.append(f"{type(e).__name__}: {e}")
                continue
            try:
                store.finish(att, "succeeded", reward=1.0)
                with ledger.lock:
                    ledger.finished.add(att.key)
            except BoltrlError as e:
                with ledger.lock:
                    ledger.finish_errors[att.key] = f"{type(e).__name__}: {e}"
    finally:
        store.close()


def store_kill(seconds: float, clients: int = 24, kills: int = 2) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="boltrl-rel-"))
    db, port = tmp / "store.db", _free_port()
    url = f"http://127.0.0.1:{port}"
    proc = _start_server(db, port)
    ledger = Ledger()
    until = time.monotonic() + seconds
    threads = [
        threading.Thread(target=_client, args=(url, i, until, ledger)) for i in range(clients)
    ]
    for t in threads:
        t.start()
    for _ in range(kills):
        time.sleep(seconds / (kills + 1))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc = _start_server(db, port)
    for t in threads:
        t.join()
    proc.send_signal(signal.SIGTERM)
    proc.wait(30)
    store = SqliteStore(db)
    try:
        heads = store.query(limit=10**9)
        by_task: dict[str, int] = {}
        for h in heads:
            by_task[h.task.id] = by_task.get(h.task.id, 0) + 1
        stored: set[str] = set()
        committed: set[str] = set()
        for h in heads:
            r = store.get(h.id)
            stored.update(e.id for e in r.rewards)
            committed.update(a.key for a in r.attempts if a.outcome == "succeeded")
    finally:
        store.close()
    lost = [rid for rid in ledger.records if rid not in stored]
    return {
        "clients": clients,
        "kills": kills,
        "tasks acknowledged": len(ledger.tasks),
        "records acknowledged": len(ledger.records),
        "finishes acknowledged": len(ledger.finished),
        "acknowledged records lost": len(lost),
        "duplicate tasks": sum(c - 1 for c in by_task.values() if c > 1),
        "acknowledged tasks missing": sum(1 for t in ledger.tasks if t not in by_task),
        "committed finishes reported as errors": sum(
            1 for key in ledger.finish_errors if key in committed
        ),
        "finish errors (not committed)": sum(
            1 for key in ledger.finish_errors if key not in committed
        ),
        "other client errors": len(ledger.other_errors),
        "first other errors": sorted(set(ledger.other_errors))[:3],
    }


# -- kill -9 of a runner ---------------------------------------------------------------

AGENT = textwrap.dedent(
    """
    import time
    def agent(task, llm):
        time.sleep(0.2)
        return 1.0
    """
)


def runner_kill(rollouts: int = 40, seconds: float = 120.0) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="boltrl-rel-"))
    (tmp / "slow_agent.py").write_text(AGENT)
    backing = MemoryStore()
    server = serve_in_thread(backing)
    ids = backing.enqueue([Task(input={"i": i}) for i in range(rollouts)], max_attempts=3)
    cmd = [
        *CLI, "runner", "--store", server.url, "--agent", f"{tmp / 'slow_agent.py'}:agent",
        "--concurrency", "2", "--lease", "2", "--exit-when-idle",
    ]  # fmt: skip
    runners = [
        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for _ in range(2)
    ]
    try:
        deadline = time.monotonic() + 30
        while backing.count(status="succeeded") < rollouts // 4:
            if time.monotonic() > deadline:
                raise RuntimeError("runners made no progress")
            time.sleep(0.05)
        victim = runners[0]
        workers = _children(victim.pid)
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait()
        done = backing.wait(ids, timeout_s=seconds)
        runners[1].wait(seconds)
        time.sleep(1.5)  # the orphaned workers' watchdog polls once a second
        orphans = [p for p in workers if _alive(p)]
    finally:
        for r in runners:
            if r.poll() is None:
                r.kill()
        server.stop()
        backing.close()
    one_success = sum(
        1
        for r in done
        if r.status is RolloutStatus.SUCCEEDED
        and sum(a.outcome == "succeeded" for a in r.attempts) == 1
    )
    return {
        "rollouts": rollouts,
        "ended with exactly one succeeded attempt": one_success,
        "attempts lost with the killed runner (lease expired, retried)": sum(
            a.error_kind == "lease_expired" for r in done for a in r.attempts
        ),
        "child processes of the killed runner": len(workers),
        "of them still alive 1.5 s after": len(orphans),
    }


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# -- costs ------------------------------------------------------------------------------

COST_AGENT = textwrap.dedent(
    """
    import boltrl
    def agent(task, llm):
        boltrl.emit_reward(0.5)
        return 1.0
    """
)


def costs(rollouts: int = 300) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="boltrl-rel-"))
    (tmp / "cost_agent.py").write_text(COST_AGENT)
    spec = f"{tmp / 'cost_agent.py'}:agent"
    per: dict[str, float] = {}
    for isolation in ("thread", "process"):
        store = MemoryStore()
        store.enqueue([Task(input={"i": i}) for i in range(rollouts)])
        runner = Runner(spec, store, isolation=isolation, claim_wait_s=0.0)  # type: ignore[arg-type]
        t0 = time.perf_counter()
        runner.prestart()
        started = time.perf_counter()
        runner.run(exit_when_idle=True)
        per[isolation] = (time.perf_counter() - started) / rollouts * 1e3
        if isolation == "process":
            per["worker start"] = (started - t0) * 1e3
        assert store.count(status="succeeded") == rollouts
        store.close()
    store = MemoryStore()
    store.enqueue([Task(input={})])
    att = store.claim("w")
    assert att is not None and att.token is not None
    token = att.token
    n = 200_000
    check_us = timeit.timeit(lambda: same_token(token, token), number=n) / n * 1e6
    hb = 5_000
    heartbeat_us = timeit.timeit(lambda: store.heartbeat(att), number=hb) / hb * 1e6
    store.close()
    return {
        "thread isolation, ms per rollout": round(per["thread"], 2),
        "process isolation, ms per rollout": round(per["process"], 2),
        "process isolation adds, ms per rollout": round(per["process"] - per["thread"], 2),
        "worker process start (spawn + import), ms, once per slot": round(per["worker start"]),
        "fencing check, µs per call": round(check_us, 2),
        "memory-store heartbeat incl. the check, µs per call": round(heartbeat_us, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "what", nargs="?", default="all", choices=["store-kill", "runner-kill", "costs", "all"]
    )
    ap.add_argument("--seconds", type=float, default=15.0, help="store-kill run length")
    args = ap.parse_args()
    print("load average:", " ".join(f"{x:.2f}" for x in os.getloadavg()))
    if args.what in ("costs", "all"):
        print("costs:", costs())
    if args.what in ("store-kill", "all"):
        print("store kill -9 x2, 24 clients:", store_kill(args.seconds))
    if args.what in ("runner-kill", "all"):
        print("runner kill -9:", runner_kill())
    print("load average:", " ".join(f"{x:.2f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
