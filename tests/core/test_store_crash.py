"""Crash safety: a process killed with SIGKILL in the middle of writing loses nothing
that was acknowledged — neither a SQLite store writing in process, nor the HTTP server
(with its SQLite file) while clients write to it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from boltrl.errors import BoltrlError
from boltrl.records import RolloutStatus, Task, ToolStep
from boltrl.store import HttpStore, SqliteStore

pytestmark = [
    pytest.mark.timeout(90),
    pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX"),
]

ACKS_BEFORE_KILL = 300

# Prints one line per call, after the call returned: E(nqueued) R(ecorded) F(inished).
WRITER = textwrap.dedent(
    """
    import sys
    from boltrl.records import Task, ToolStep
    from boltrl.store import SqliteStore

    store = SqliteStore(sys.argv[1])
    i = 0
    while True:
        [rid] = store.enqueue([Task(input={"i": i})])
        print("E", rid, flush=True)
        att = store.claim("writer", lease_s=60)
        for k in range(5):
            rec = f"r{i}-{k}"
            store.record(att, [ToolStep(id=rec, name="x", result="y" * 200)])
            print("R", rid, rec, flush=True)
        store.finish(att, "succeeded", reward=1.0)
        print("F", rid, flush=True)
        i += 1
    """
)


def _check(path: Path, acks: list[tuple[str, ...]]) -> None:
    """Reopen the store and find every acknowledged effect in it."""
    assert sum(a[0] == "R" for a in acks) >= ACKS_BEFORE_KILL
    with SqliteStore(path) as store:  # the dead process's file lock is gone
        records: dict[str, set[str]] = {}
        for kind, rid, *rest in acks:
            if rid not in records:
                records[rid] = {t.id for t in store.get(rid).tool_steps}
            if kind == "R":
                assert rest[0] in records[rid], f"acknowledged record {rest[0]} lost"
            elif kind == "F":
                r = store.get(rid)
                assert (r.status, r.reward) == (RolloutStatus.SUCCEEDED, 1.0), rid
        # Nothing half-written either: every stored record is whole and counted once.
        for rid in records:
            r = store.get(rid)
            assert len({t.id for t in r.tool_steps}) == len(r.tool_steps)
            assert all(t.result == "y" * 200 for t in r.tool_steps)


def test_sqlite_writer_killed_mid_write_loses_no_acknowledged_record(tmp_path: Path) -> None:
    path = tmp_path / "crash.db"
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, text=True
    )
    acks: list[tuple[str, ...]] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            acks.append(tuple(line.split()))
            if sum(a[0] == "R" for a in acks) >= ACKS_BEFORE_KILL:
                os.kill(proc.pid, signal.SIGKILL)
                break
        # Lines the writer printed before it died are still in the pipe: acknowledged too.
        rest, _ = proc.communicate(timeout=30)
        acks.extend(tuple(x.split()) for x in rest.splitlines(keepends=True) if x.endswith("\n"))
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    _check(path, acks)


def _start_server(path: Path) -> tuple[subprocess.Popen[str], str]:
    cli = "import sys; from boltrl.cli import main; sys.exit(main())"
    proc = subprocess.Popen(
        [sys.executable, "-c", cli, "store", "serve", "--db", str(path), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert " on http://127.0.0.1:" in line, line
    return proc, line.split(" on ")[1].split()[0]


def test_http_server_killed_mid_write_loses_no_acknowledged_record(tmp_path: Path) -> None:
    path = tmp_path / "served.db"
    proc, url = _start_server(path)
    acks: list[tuple[str, ...]] = []
    lock = threading.Lock()
    enough = threading.Event()

    def ack(*entry: str) -> None:
        with lock:
            acks.append(entry)
            if sum(a[0] == "R" for a in acks) >= ACKS_BEFORE_KILL:
                enough.set()

    def writer(w: int, client: HttpStore) -> None:
        try:
            for i in range(10_000):
                [rid] = client.enqueue([Task(input={"w": w, "i": i})])
                ack("E", rid)
                att = client.claim(f"writer-{w}", lease_s=60, wait_s=5)
                assert att is not None
                for k in range(5):
                    rec = f"w{w}-{i}-{k}"
                    client.record(att, [ToolStep(id=rec, name="x", result="y" * 200)])
                    ack("R", att.rollout_id, rec)
                client.finish(att, "succeeded", reward=1.0)
                ack("F", att.rollout_id)
        except BoltrlError:
            pass  # the server died under us: expected

    # Four writers share one client, so records also travel in shared batches.
    client = HttpStore(url, retries=1, backoff_s=0.01)
    threads = [threading.Thread(target=writer, args=(w, client)) for w in range(4)]
    try:
        for t in threads:
            t.start()
        assert enough.wait(60), "writers were too slow"
        os.kill(proc.pid, signal.SIGKILL)
        for t in threads:
            t.join(30)
            assert not t.is_alive()
    finally:
        proc.kill()
        proc.wait()
        client.close()
    assert proc.returncode == -signal.SIGKILL
    _check(path, acks)
