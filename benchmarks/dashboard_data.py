"""A big SQLite store for the dashboard benchmark, written with bulk SQL in the store's
own schema: ``--rollouts`` rollouts of ``--calls`` model calls each (every call with its
adapter annotation naming the agent), one tool step and one final reward per rollout,
tagged as two training runs. Built once and reused (``runs/bench/``)."""

from __future__ import annotations

import json
import random
import sqlite3
import time
from pathlib import Path

from boltrl.store import SqliteStore

AGENTS = ("planner", "solver", "critic", "searcher")
_INDEXES = ("rollouts_by_status", "rollouts_by_run", "rollouts_by_task", "records_by_agent")


def _head(i: int, rid: str, now: float, rng: random.Random) -> tuple[str, dict[str, object]]:
    run, step = ("bench-a", i // 64) if i % 5 else ("bench-b", i // 320)
    phase = "val" if (i // 64) % 10 == 9 else "train"
    created = now - 86_400 + i * 0.8
    roll = rng.random()
    status = "succeeded" if roll < 0.97 else ("failed" if roll < 0.99 else "cancelled")
    attempt: dict[str, object] = {
        "rollout_id": rid,
        "number": 1,
        "worker_id": f"worker-{i % 16}",
        "started_at": created + 0.1,
        "lease_expires_at": created + 30.0,
        "last_heartbeat": created + 5.0,
        "outcome": status,
        "ended_at": created + 6.0,
        "error_kind": None if status == "succeeded" else "exception",
        "error": None
        if status == "succeeded"
        else "Traceback (most recent call last):\nValueError",
        "task": None,
        "timeout_s": None,
    }
    reward = round(min(1.0, step / 1000 + rng.gauss(0.3, 0.15)), 4)
    head = {
        "schema_version": 1,
        "id": rid,
        "task": {
            "id": f"task-{i % 5000}",
            "input": {"question": f"question {i % 5000}"},
            "group": None,
            "split": phase,
            "metadata": {"run": run, "step": step, "phase": phase},
        },
        "status": status,
        "max_attempts": 3,
        "timeout_s": None,
        "created_at": created,
        "finished_at": created + 6.0,
        "reward": reward if status == "succeeded" else None,
        "error": attempt["error"],
        "attempts": [attempt],
        "calls": [],
        "tool_steps": [],
        "rewards": [],
        "annotations": [],
        "unjoined_calls": 0,
    }
    return status, head


def _records(rid: str, calls: int, t0: float, version: int) -> list[tuple[str, int, str, str, str]]:
    out = []
    for c in range(calls):
        cid = f"chatcmpl-{rid[3:]}-{c}"
        body = {
            "kind": "llm_call", "seq": 0, "id": cid, "rollout_id": rid, "attempt": 1,
            "agent": None, "parent_id": None,
            "request": {"api": "chat", "model": "policy",
                        "messages": [{"role": "user", "content": f"turn {c}"}]},
            "response": {"message": {"role": "assistant", "content": "ok"},
                         "finish_reason": "stop"},
            "prompt_token_ids": list(range(100 + c, 228 + c)),
            "response_token_ids": list(range(32)),
            "response_logprobs": [-0.25] * 32,
            "policy_version": version, "template_hash": "bench", "model": "policy",
            "usage": {"prompt_tokens": 128, "completion_tokens": 32, "total_tokens": 160},
            "started_at": t0 + c * 0.5, "ended_at": t0 + c * 0.5 + 0.4,
            "status": "ok", "error": None, "cached": False,
        }  # fmt: skip
        ann = {"kind": "call_annotation", "seq": 0, "id": f"ann-{cid}", "rollout_id": rid,
               "attempt": 1, "call_id": cid, "agent": AGENTS[c % 3], "framework": "bench",
               "parent_id": f"turn-{c % 3}", "index": c}  # fmt: skip
        out.append((rid, 1, cid, "llm_call", json.dumps(body)))
        out.append((rid, 1, ann["id"], "call_annotation", json.dumps(ann)))  # type: ignore[arg-type]
    return out


def build(path: Path, rollouts: int, calls: int, *, seed: int = 0) -> None:
    """Write the store at ``path`` (replacing it)."""
    for suffix in ("", "-wal", "-shm", ".lock"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    SqliteStore(path).close()  # the store's own schema
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA synchronous=OFF")
    for name in _INDEXES:  # rebuilt by the store at the end: faster than keeping them
        db.execute(f"DROP INDEX {name}")
    rng = random.Random(seed)
    now = time.time()
    batch = 2000
    for lo in range(0, rollouts, batch):
        heads, records = [], []
        for i in range(lo, min(rollouts, lo + batch)):
            rid = f"ro-bench{i:08d}"
            status, head = _head(i, rid, now, rng)
            if i >= rollouts - 16:  # the newest few are still running
                status = head["status"] = "running"
                head.update(finished_at=None, reward=None, error=None)
                head["attempts"][0].update(outcome="running", ended_at=None, error=None)  # type: ignore[index]
            heads.append((i + 1, rid, status, json.dumps(head)))
            t0 = float(head["created_at"])  # type: ignore[arg-type]
            records += _records(rid, calls, t0, int(head["task"]["metadata"]["step"]))  # type: ignore[index]
            if status != "running":
                tool = {"kind": "tool_step", "seq": 0, "id": f"tool-{rid}", "rollout_id": rid,
                        "attempt": 1, "name": "search", "arguments": {"q": "x"},
                        "result": "found", "agent": "searcher" if i % 7 == 0 else "solver",
                        "started_at": t0 + 1, "ended_at": t0 + 1.1}  # fmt: skip
                records.append((rid, 1, tool["id"], "tool_step", json.dumps(tool)))  # type: ignore[arg-type]
        db.execute("BEGIN")
        db.executemany("INSERT INTO rollouts (ord, id, status, head) VALUES (?,?,?,?)", heads)
        db.executemany(
            "INSERT INTO records (rollout_id, attempt, id, kind, body) VALUES (?,?,?,?,?)",
            records,
        )
        db.execute("COMMIT")
        print(f"\r  {min(rollouts, lo + batch):,} / {rollouts:,} rollouts", end="", flush=True)
    db.execute("INSERT OR REPLACE INTO meta VALUES ('bench', ?)", (f"{rollouts}x{calls}",))
    db.close()
    print("\n  indexing…", flush=True)
    SqliteStore(path).close()  # CREATE INDEX IF NOT EXISTS, as any open does


def ensure(path: Path, rollouts: int, calls: int) -> None:
    """Build the store unless ``path`` already holds one of this size."""
    if path.exists():
        db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            row = db.execute("SELECT value FROM meta WHERE key = 'bench'").fetchone()
        finally:
            db.close()
        if row is not None and row[0] == f"{rollouts}x{calls}":
            return
    path.parent.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    print(f"building {path} ({rollouts:,} rollouts, {calls} calls each)…", flush=True)
    build(path, rollouts, calls)
    print(f"  built in {time.perf_counter() - t:.0f} s", flush=True)
