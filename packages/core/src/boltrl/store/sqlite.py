"""The SQLite store: the embedded default. One file, WAL journal, every call one commit.

Durability: each method that changes something commits before it returns. In WAL mode a
commit appends the transaction to the ``-wal`` file with ``write()``; with
``synchronous=NORMAL`` (the default here) SQLite skips the ``fsync`` at commit, so the
data sits in the OS page cache — which a process crash (kill -9, OOM kill, segfault)
does not touch. Every acknowledged record therefore survives the death of the process;
only an OS crash or power loss can lose the last transactions (never corrupt the file).
Pass ``?synchronous=FULL`` in the URL (``sqlite:///runs/x.db?synchronous=FULL``) to
``fsync`` every commit and survive power loss too, at a large cost in commits/s.

One process owns a database file at a time (an advisory lock on ``<file>.lock``
enforces it): the live queue and leases are kept in that process's memory, so a second
writer would break them. Other processes reach the store through ``boltrl store serve``.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from pathlib import Path
from typing import IO, Any

from boltrl.errors import Conflict, InvalidInput
from boltrl.records import (
    RECORDS_ADAPTER,
    AnyRecord,
    Resources,
    RewardEvent,
    Rollout,
    RolloutStatus,
)
from boltrl.store._engine import Once
from boltrl.store._sessions import FEEDBACK_ID, SESSION_PREFIX, SessionEngine

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no advisory lock, documented above
    fcntl = None  # type: ignore[assignment]

_SCHEMA_VERSION = 1
_ONCE_KEEP_S = 7 * 24 * 3600.0
"""How long an enqueue's idempotency key is remembered (a week: far past any retry)."""
_SYNC_MODES = ("OFF", "NORMAL", "FULL", "EXTRA")

# The indexed expressions, for the dashboard's read-only SQL (boltrl.dashboard.sqlsource
# imports them): SQLite uses an index on an expression only for a query that writes the
# expression the same way, so both sides are built from these strings.
RUN_EXPR = "json_extract(head, '$.task.metadata.run')"
"""A rollout's run tag (``rollouts`` table)."""
TASK_EXPR = "json_extract(head, '$.task.id')"
"""A rollout's task id (``rollouts`` table)."""
AGENT_EXPR = "json_extract(body, '$.agent')"
"""A record's agent name (``records`` table)."""
AGENT_KINDS = "kind IN ('call_annotation', 'tool_step')"
"""The ``records_by_agent`` index's WHERE clause: a query must state it to use the index."""

_FEEDBACK_WHERE = f"kind = 'reward' AND id = '{FEEDBACK_ID}'"
"""The ``records_feedback`` index's WHERE clause (a query states it to use the index)."""

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS rollouts (
    ord    INTEGER PRIMARY KEY,           -- enqueue order
    id     TEXT NOT NULL UNIQUE,
    status TEXT NOT NULL,
    head   TEXT NOT NULL                  -- Rollout JSON without records
);
CREATE INDEX IF NOT EXISTS rollouts_by_status ON rollouts (status, ord);
-- Enqueues done under an Idempotency-Key, written in the enqueue's own transaction, so
-- a client's retry after a lost answer (a store restart included) does not enqueue again.
CREATE TABLE IF NOT EXISTS idempotency (
    key          TEXT PRIMARY KEY,
    request_hash TEXT NOT NULL,
    answer       TEXT NOT NULL,           -- the rollout ids, JSON
    created_at   REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS records (
    seq        INTEGER PRIMARY KEY,       -- global write order (rowid)
    rollout_id TEXT NOT NULL,
    attempt    INTEGER NOT NULL,
    id         TEXT NOT NULL,
    kind       TEXT NOT NULL,
    body       TEXT NOT NULL,             -- record JSON (seq filled from the column)
    UNIQUE (rollout_id, attempt, id)      -- idempotent writes; also the per-rollout index
);
-- For the dashboard's read-only SQL (boltrl.dashboard.sqlsource): filter rollouts by run
-- and task, and find the rollouts an agent took part in, without scanning every row.
CREATE INDEX IF NOT EXISTS rollouts_by_run ON rollouts ({RUN_EXPR}, ord);
CREATE INDEX IF NOT EXISTS rollouts_by_task ON rollouts ({TASK_EXPR}, ord);
CREATE INDEX IF NOT EXISTS records_by_agent ON records ({AGENT_EXPR}, rollout_id)
    WHERE {AGENT_KINDS};
-- Sessions' feedback by arrival, for a learner's cursor (SessionStore.rewarded_sessions).
CREATE INDEX IF NOT EXISTS records_feedback ON records (seq) WHERE {_FEEDBACK_WHERE};
"""


class SqliteStore(SessionEngine):
    """A ``Store`` (and ``SessionStore``) in one SQLite file (``open_store("sqlite:///path.db")``).

    Survives kill -9 of the process with every acknowledged call intact (see the module
    docstring for why ``synchronous=NORMAL`` suffices and when to ask for ``FULL``).
    Reopening restores the queue, running attempts and their leases, and resources.
    Raises ``Conflict`` when another process (or store object) has the file open.
    """

    def __init__(self, path: str | os.PathLike[str], *, synchronous: str = "NORMAL") -> None:
        super().__init__()
        sync = synchronous.upper()
        if sync not in _SYNC_MODES:
            raise InvalidInput(f"synchronous: expected one of {', '.join(_SYNC_MODES)}")
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lockfile = _lock(self.path)
        try:
            self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            self._setup(sync)
            (top,) = self._db.execute("SELECT COALESCE(MAX(ord), 0) FROM rollouts").fetchone()
            self._restore(self._load_active(), self._load_resources(), int(top) + 1)
        except BaseException:
            self._lockfile.close()
            raise

    # -- setup ----------------------------------------------------------------------------

    def _setup(self, sync: str) -> None:
        db = self._db
        mode = db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise InvalidInput(f"{self.path}: could not switch SQLite to WAL (got {mode})")
        db.execute(f"PRAGMA synchronous={sync}")
        db.execute("PRAGMA busy_timeout=5000")
        db.executescript(_SCHEMA)
        row = db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        if row is None:
            db.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(_SCHEMA_VERSION),))
        elif int(row[0]) != _SCHEMA_VERSION:
            raise InvalidInput(
                f"{self.path}: store schema version {row[0]}, this boltrl reads {_SCHEMA_VERSION}"
            )

    def _load_active(self) -> list[tuple[int, Rollout]]:
        rows = self._db.execute(
            "SELECT ord, head FROM rollouts WHERE status IN ('queued','requeued','running')"
        ).fetchall()
        return [(o, Rollout.model_validate_json(h)) for o, h in rows]

    def _load_resources(self) -> Resources:
        row = self._db.execute("SELECT value FROM meta WHERE key='resources'").fetchone()
        return Resources() if row is None else Resources.model_validate_json(row[0])

    def _tx(self, sql: str, rows: list[tuple[Any, ...]]) -> None:
        """Run one statement over rows as one committed transaction (all or nothing)."""
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            db.executemany(sql, rows)
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    # -- persistence hooks (called with the engine's lock held) ----------------------------

    def _p_insert(self, rows: list[tuple[int, Rollout]], once: Once | None = None) -> None:
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            db.executemany(
                "INSERT INTO rollouts (ord, id, status, head) VALUES (?, ?, ?, ?)",
                [(o, h.id, h.status.value, h.model_dump_json()) for o, h in rows],
            )
            if once is not None:
                now = time.time()
                db.execute("DELETE FROM idempotency WHERE created_at < ?", (now - _ONCE_KEEP_S,))
                db.execute(
                    "INSERT INTO idempotency VALUES (?, ?, ?, ?)",
                    (once.key, once.request_hash, json.dumps(once.ids), now),
                )
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    def _p_once(self, key: str) -> Once | None:
        row = self._db.execute(
            "SELECT request_hash, answer FROM idempotency WHERE key = ?", (key,)
        ).fetchone()
        return None if row is None else Once(key=key, request_hash=row[0], ids=json.loads(row[1]))

    def _p_update(self, head: Rollout) -> None:
        # A single statement in autocommit mode is its own committed transaction.
        self._db.execute(
            "UPDATE rollouts SET status = ?, head = ? WHERE id = ?",
            (head.status.value, head.model_dump_json(), head.id),
        )

    def _p_head(self, rollout_id: str) -> Rollout | None:
        row = self._db.execute("SELECT head FROM rollouts WHERE id = ?", (rollout_id,)).fetchone()
        return None if row is None else Rollout.model_validate_json(row[0])

    def _p_add_records(self, rollout_id: str, records: list[AnyRecord]) -> None:
        self._tx(
            "INSERT OR IGNORE INTO records (rollout_id, attempt, id, kind, body) "
            "VALUES (?, ?, ?, ?, ?)",
            [(rollout_id, r.attempt, r.id, r.kind, r.model_dump_json()) for r in records],
        )

    def _p_records(self, rollout_id: str) -> list[AnyRecord]:
        rows = self._db.execute(
            "SELECT seq, body FROM records WHERE rollout_id = ? ORDER BY seq", (rollout_id,)
        ).fetchall()
        if not rows:
            return []
        # One JSON array parses much faster than one document per row.
        records = RECORDS_ADAPTER.validate_json("[" + ",".join(b for _, b in rows) + "]")
        return [r.model_copy(update={"seq": s}) for r, (s, _) in zip(records, rows, strict=True)]

    def _p_query(self, status: RolloutStatus | None, limit: int, offset: int) -> list[Rollout]:
        if status is None:
            rows = self._db.execute(
                "SELECT head FROM rollouts ORDER BY ord LIMIT ? OFFSET ?", (limit, offset)
            ).fetchall()
        else:
            rows = self._db.execute(
                "SELECT head FROM rollouts WHERE status = ? ORDER BY ord LIMIT ? OFFSET ?",
                (status.value, limit, offset),
            ).fetchall()
        return [Rollout.model_validate_json(h) for (h,) in rows]

    def _p_count(self, status: RolloutStatus | None) -> int:
        if status is None:
            row = self._db.execute("SELECT COUNT(*) FROM rollouts").fetchone()
        else:
            row = self._db.execute(
                "SELECT COUNT(*) FROM rollouts WHERE status = ?", (status.value,)
            ).fetchone()
        return int(row[0])

    def _p_feedback(self, head: Rollout, event: RewardEvent) -> None:
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            db.execute(
                "INSERT INTO records (rollout_id, attempt, id, kind, body) VALUES (?, ?, ?, ?, ?)",
                (head.id, event.attempt, event.id, event.kind, event.model_dump_json()),
            )
            db.execute(
                "UPDATE rollouts SET status = ?, head = ? WHERE id = ?",
                (head.status.value, head.model_dump_json(), head.id),
            )
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    def _p_feedback_since(self, after: int, limit: int) -> list[tuple[int, str]]:
        rows = self._db.execute(
            f"SELECT seq, rollout_id FROM records WHERE seq > ? AND {_FEEDBACK_WHERE} "
            "AND rollout_id LIKE ? ORDER BY seq LIMIT ?",
            (after, SESSION_PREFIX + "%", limit),
        ).fetchall()
        return [(int(seq), str(rid)) for seq, rid in rows]

    def _p_save_resources(self, resources: Resources) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO meta VALUES ('resources', ?)", (resources.model_dump_json(),)
        )

    def _p_close(self) -> None:
        try:
            self._db.close()
        finally:
            self._lockfile.close()


def _lock(path: Path) -> IO[bytes]:
    """Hold an exclusive advisory lock on ``<path>.lock`` for the store's lifetime.

    The OS drops it when the process dies, so a killed store never blocks reopening.
    """
    f = open(f"{path}.lock", "ab")  # held open until close()
    if fcntl is not None:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            raise Conflict(
                f"{path} is already open by another store (this or another process); "
                "share it through `boltrl store serve` and open_store('http://…')"
            ) from None
    return f
