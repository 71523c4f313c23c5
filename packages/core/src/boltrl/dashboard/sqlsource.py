"""The dashboard's SQL source: reads a SQLite store's file directly, read-only.

It opens its own ``mode=ro`` connection, so it neither takes the store's file lock nor
writes anything: ``boltrl dashboard --store sqlite:///runs/x.db`` watches a database
that a trainer in another process is writing (WAL lets readers and the writer run side
by side). Filters use the store's indexes (status, run, task id, and agent names of
annotations and tool steps); every query is one short statement in autocommit mode, so
no read transaction holds back the writer's checkpoints.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from boltrl.dashboard.model import AttemptInfo, Filters, HeadInfo, RecordFacts
from boltrl.errors import InvalidInput, NotFound
from boltrl.records import RECORDS_ADAPTER, Rollout
from boltrl.store._checks import assemble

_RUN = "json_extract(head, '$.task.metadata.run')"
_TASK = "json_extract(head, '$.task.id')"
_AGENT = "json_extract(body, '$.agent')"
_AGENT_KINDS = "kind IN ('call_annotation', 'tool_step')"
"""Must match the ``records_by_agent`` index's WHERE clause word for word."""

_HEAD_COLUMNS = f"""ord, id, status, {_TASK},
    {_RUN}, json_extract(head, '$.task.metadata.phase'),
    json_extract(head, '$.task.metadata.step'), json_extract(head, '$.task.split'),
    json_extract(head, '$.task.group'), json_extract(head, '$.reward'),
    json_extract(head, '$.created_at'), json_extract(head, '$.attempts[0].started_at'),
    json_extract(head, '$.finished_at'), json_array_length(head, '$.attempts'),
    json_extract(head, '$.attempts[#-1].worker_id'),
    json_extract(head, '$.attempts[#-1].error_kind')"""


def _str(v: Any) -> str | None:
    return None if v is None else str(v)


def _head(row: tuple[Any, ...]) -> HeadInfo:
    step = row[6]
    return HeadInfo(
        ord=row[0],
        id=row[1],
        status=row[2],
        task_id=str(row[3]),
        run=_str(row[4]),
        phase=_str(row[5]),
        step=step if isinstance(step, int) else None,
        split=_str(row[7]),
        group=_str(row[8]),
        reward=None if row[9] is None else float(row[9]),
        created_at=float(row[10] or 0.0),
        started_at=None if row[11] is None else float(row[11]),
        finished_at=None if row[12] is None else float(row[12]),
        attempts=int(row[13] or 0),
        worker=_str(row[14]),
        error_kind=_str(row[15]),
    )


def _where(f: Filters) -> tuple[str, list[Any]]:
    conds: list[str] = []
    args: list[Any] = []
    if f.status:
        conds.append(f"status IN ({','.join('?' * len(f.status))})")
        args += f.status
    if f.run is not None:
        conds.append(f"{_RUN} = ?")
        args.append(f.run)
    if f.task is not None:
        conds.append(f"{_TASK} = ?")
        args.append(f.task)
    if f.agent is not None:
        conds.append(
            f"id IN (SELECT rollout_id FROM records WHERE {_AGENT_KINDS} AND {_AGENT} = ?)"
        )
        args.append(f.agent)
    return (" WHERE " + " AND ".join(conds)) if conds else "", args


class SqliteSource:
    """A ``Source`` over a SQLite store file (see the module docstring).

    ``workers`` is an optional callable giving the store's live worker view, for when the
    store object lives in this process (``source_for(SqliteStore)`` passes it).
    """

    def __init__(self, path: str | Path, *, workers: Any = None) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise InvalidInput(f"store: no SQLite store at {self.path}")
        self.label = f"sqlite:///{self.path}"
        uri = self.path.resolve().as_uri() + "?mode=ro"
        self._db = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA busy_timeout=5000")
        self._lock = threading.Lock()
        self._workers = workers
        try:
            self._q("SELECT 1 FROM rollouts LIMIT 1")
        except sqlite3.DatabaseError as e:
            self._db.close()
            raise InvalidInput(f"store: {self.path} is not a boltrl SQLite store ({e})") from None

    def _q(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._db.execute(sql, tuple(args)).fetchall()

    # -- the Source API -------------------------------------------------------------------

    def heads_after(self, cursor: int, limit: int) -> list[HeadInfo]:
        rows = self._q(
            f"SELECT {_HEAD_COLUMNS} FROM rollouts WHERE ord > ? ORDER BY ord LIMIT ?",
            (cursor, limit),
        )
        return [_head(r) for r in rows]

    def heads_of(self, ids: Sequence[str]) -> list[HeadInfo]:
        out: list[HeadInfo] = []
        for i in range(0, len(ids), 500):
            chunk = list(ids[i : i + 500])
            marks = ",".join("?" * len(chunk))
            rows = self._q(f"SELECT {_HEAD_COLUMNS} FROM rollouts WHERE id IN ({marks})", chunk)
            out += [_head(r) for r in rows]
        return out

    def page(self, filters: Filters, limit: int, offset: int) -> tuple[list[HeadInfo], int]:
        where, args = _where(filters)
        rows = self._q(
            f"SELECT {_HEAD_COLUMNS} FROM rollouts{where} ORDER BY ord DESC LIMIT ? OFFSET ?",
            [*args, limit, offset],
        )
        total = self._q(f"SELECT COUNT(*) FROM rollouts{where}", args)[0][0]
        return [_head(r) for r in rows], int(total)

    def facts(self, ids: Sequence[str]) -> dict[str, RecordFacts]:
        out = {rid: RecordFacts() for rid in ids}
        if not ids:
            return out
        marks = ",".join("?" * len(ids))
        rows = self._q(
            f"SELECT rollout_id, kind, {_AGENT}, json_extract(body, '$.policy_version') "
            f"FROM records WHERE rollout_id IN ({marks}) ORDER BY seq",
            list(ids),
        )
        for rid, kind, agent, version in rows:
            f = out[rid]
            if agent is not None and agent not in f.agents:
                f.agents.append(str(agent))
            if agent is not None and kind != "llm_call" and agent not in f.named:
                f.named.append(str(agent))
            if kind == "llm_call":
                f.calls += 1
                if isinstance(version, int) and version not in f.policy_versions:
                    f.policy_versions.append(version)
            elif kind == "tool_step":
                f.tool_steps += 1
            elif kind == "reward":
                f.rewards += 1
        return out

    def agents(self) -> list[str]:
        rows = self._q(
            f"SELECT DISTINCT {_AGENT} FROM records WHERE {_AGENT_KINDS} AND {_AGENT} IS NOT NULL"
        )
        return sorted(str(a) for (a,) in rows)

    def get(self, rollout_id: str) -> Rollout:
        found = self._q("SELECT head FROM rollouts WHERE id = ?", (rollout_id,))
        if not found:
            raise NotFound(f"unknown rollout {rollout_id!r}")
        head = Rollout.model_validate_json(found[0][0])
        rows = self._q(
            "SELECT seq, body FROM records WHERE rollout_id = ? ORDER BY seq", (rollout_id,)
        )
        if not rows:
            return assemble(head, [])
        records = RECORDS_ADAPTER.validate_json("[" + ",".join(b for _, b in rows) + "]")
        seqs = [s for s, _ in rows]
        return assemble(
            head, [r.model_copy(update={"seq": s}) for r, s in zip(records, seqs, strict=True)]
        )

    def group_rewards(self, head: HeadInfo) -> list[float]:
        if head.group is None:  # the task id is the group: the task index finds them
            where, args = f"{_TASK} = ?", [head.task_id]
        elif head.run is not None:
            where, args = (
                f"{_RUN} = ? AND json_extract(head, '$.task.group') = ?",
                [
                    head.run,
                    head.group,
                ],
            )
        else:
            where, args = "json_extract(head, '$.task.group') = ?", [head.group]
        rows = self._q(f"SELECT {_HEAD_COLUMNS} FROM rollouts WHERE {where}", args)
        return [
            h.reward
            for h in map(_head, rows)
            if h.reward is not None
            and h.terminal
            and (h.run, h.phase, h.step) == (head.run, head.phase, head.step)
        ]

    def recent_attempts(self, rollouts: int) -> list[AttemptInfo]:
        rows = self._q(
            """SELECT r.id, json_extract(a.value, '$.worker_id'),
                      json_extract(a.value, '$.outcome'), json_extract(a.value, '$.started_at'),
                      json_extract(a.value, '$.last_heartbeat'),
                      json_extract(a.value, '$.lease_expires_at'),
                      json_extract(a.value, '$.ended_at')
               FROM (SELECT * FROM (SELECT id, head FROM rollouts ORDER BY ord DESC LIMIT ?)
                     UNION SELECT id, head FROM rollouts WHERE status = 'running') AS r,
                    json_each(r.head, '$.attempts') AS a""",
            (rollouts,),
        )
        return [
            AttemptInfo(
                rollout_id=r[0],
                worker=str(r[1]),
                outcome=str(r[2]),
                started_at=float(r[3]),
                last_heartbeat=float(r[4]),
                lease_expires_at=float(r[5]),
                ended_at=None if r[6] is None else float(r[6]),
            )
            for r in rows
        ]

    def live_workers(self) -> list[dict[str, Any]] | None:
        if self._workers is None:
            return None
        return [w.model_dump() for w in self._workers()]

    def change_token(self) -> object:
        # data_version changes whenever another connection (the store's) commits.
        return self._q("PRAGMA data_version")[0][0]

    def close(self) -> None:
        with self._lock:
            self._db.close()
