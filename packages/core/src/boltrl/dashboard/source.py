"""Dashboard sources by URL or store object, and the generic source over any ``Store``.

``StoreSource`` needs nothing but the ``Store`` protocol: it mirrors every rollout head
in memory (refreshed incrementally: finished heads never change, so each refresh reads
only from the oldest unfinished rollout on) and fetches records with ``get`` only for
the rows a page shows, caching them once a rollout has finished. Right for the memory
store and for a served store of moderate size; for big SQLite stores ``open_source``
and ``source_for`` pick ``SqliteSource``, which asks SQLite with indexes instead.
"""

from __future__ import annotations

import threading
import urllib.parse
from collections.abc import Sequence
from typing import Any

from boltrl.dashboard.model import AttemptInfo, Filters, HeadInfo, RecordFacts, Source
from boltrl.errors import InvalidInput
from boltrl.records import Rollout, RolloutStatus
from boltrl.scoring import rollout_score
from boltrl.store.base import Store

_PAGE = 1000
_AGENT_SCAN = 1000
"""How many of the newest rollouts ``agents()`` reads records of (older ones count once
their facts were read for a page)."""


def head_info(order: int, r: Rollout) -> HeadInfo:
    """The ``HeadInfo`` of a rollout (``order``: its enqueue order). Its ``reward`` is the
    score (``boltrl.scoring``), so a rollout that returned none needs its reward records
    (``needs_records``)."""
    meta = r.task.metadata
    step = meta.get("step")
    last = r.attempts[-1] if r.attempts else None
    run, phase = meta.get("run"), meta.get("phase")
    return HeadInfo(
        ord=order,
        id=r.id,
        status=r.status.value,
        task_id=r.task.id,
        run=None if run is None else str(run),
        phase=str(phase) if phase is not None else r.task.split,
        step=step if isinstance(step, int) and not isinstance(step, bool) else None,
        split=r.task.split,
        group=r.task.group,
        reward=rollout_score(r) if r.status == RolloutStatus.SUCCEEDED else r.reward,
        created_at=r.created_at,
        started_at=r.attempts[0].started_at if r.attempts else None,
        finished_at=r.finished_at,
        attempts=len(r.attempts),
        worker=None if last is None else last.worker_id,
        error_kind=None if last is None else last.error_kind,
    )


def needs_records(r: Rollout) -> bool:
    """True when a head alone cannot give the rollout's score: it succeeded without
    returning a reward, so its ``emit_reward`` events decide it."""
    return r.status == RolloutStatus.SUCCEEDED and r.reward is None


def record_facts(r: Rollout) -> RecordFacts:
    f = RecordFacts(calls=len(r.calls), tool_steps=len(r.tool_steps), rewards=len(r.rewards))
    named = [a.agent for a in r.annotations] + [t.agent for t in r.tool_steps]
    for name in [c.agent for c in r.calls] + named:
        if name is not None and name not in f.agents:
            f.agents.append(name)
    f.named = sorted({n for n in named if n is not None})
    for c in r.calls:
        if c.policy_version is not None and c.policy_version not in f.policy_versions:
            f.policy_versions.append(c.policy_version)
    return f


class StoreSource:
    """A ``Source`` over any ``Store`` (see the module docstring). Thread-safe."""

    def __init__(self, store: Store, label: str = "store") -> None:
        self.store = store
        self.label = label
        self._lock = threading.Lock()
        self._heads: list[HeadInfo] = []
        """Every rollout head, in enqueue order (``ord`` = index + 1)."""
        self._index: dict[str, int] = {}
        self._first_active = 0
        """Index of the oldest unfinished head: everything before it is final."""
        self._facts: dict[str, RecordFacts] = {}
        """Record facts of finished rollouts (they no longer change)."""

    def _refresh(self) -> list[HeadInfo]:
        """Bring the mirror up to date; returns the heads in enqueue order."""
        with self._lock:
            start = self._first_active
            fresh: list[Rollout] = []
            while True:
                got = self.store.query(limit=_PAGE, offset=start + len(fresh))
                fresh += got
                if len(got) < _PAGE:
                    break
            heads = self._heads[:start]
            for i, r in enumerate(fresh):
                full = self.store.get(r.id) if needs_records(r) else r  # once: it is final
                heads.append(head_info(start + i + 1, full))
                self._index[r.id] = start + i
            self._heads = heads
            first = start
            while first < len(heads) and heads[first].terminal:
                first += 1
            self._first_active = first
            return heads

    def heads_after(self, cursor: int, limit: int) -> list[HeadInfo]:
        return self._refresh()[cursor : cursor + limit]

    def heads_of(self, ids: Sequence[str]) -> list[HeadInfo]:
        heads = self._refresh()
        return [heads[self._index[i]] for i in ids if i in self._index]

    def _facts_of(self, heads: Sequence[HeadInfo]) -> dict[str, RecordFacts]:
        out: dict[str, RecordFacts] = {}
        for h in heads:
            cached = self._facts.get(h.id)
            if cached is None:
                cached = record_facts(self.store.get(h.id))
                if h.terminal:
                    self._facts[h.id] = cached
            out[h.id] = cached
        return out

    def page(self, filters: Filters, limit: int, offset: int) -> tuple[list[HeadInfo], int]:
        matching = [h for h in reversed(self._refresh()) if filters.matches(h)]
        if filters.agent is not None:
            facts = self._facts_of(matching)
            matching = [h for h in matching if filters.agent in facts[h.id].named]
        return matching[offset : offset + limit], len(matching)

    def facts(self, ids: Sequence[str]) -> dict[str, RecordFacts]:
        return self._facts_of(self.heads_of(ids))

    def agents(self) -> list[str]:
        recent = self._facts_of(self._refresh()[-_AGENT_SCAN:])
        found: set[str] = set()
        for f in [*self._facts.values(), *recent.values()]:
            found.update(f.named)
        return sorted(found)

    def get(self, rollout_id: str) -> Rollout:
        return self.store.get(rollout_id)

    def group_rewards(self, head: HeadInfo) -> list[float]:
        key = head.group or head.task_id
        return [
            h.reward
            for h in self._refresh()
            if (h.group or h.task_id) == key
            and (h.run, h.phase, h.step) == (head.run, head.phase, head.step)
            and h.terminal
            and h.reward is not None
        ]

    def recent_attempts(self, rollouts: int) -> list[AttemptInfo]:
        heads = self._refresh()
        wanted = {h.id for h in heads[-rollouts:]} | {h.id for h in heads if h.status == "running"}
        out: list[AttemptInfo] = []
        for rid in wanted:
            r = self.store.get(rid) if rid in self._index else None
            for a in r.attempts if r is not None else []:
                out.append(
                    AttemptInfo(
                        rollout_id=rid,
                        worker=a.worker_id,
                        outcome=a.outcome.value,
                        started_at=a.started_at,
                        last_heartbeat=a.last_heartbeat,
                        lease_expires_at=a.lease_expires_at,
                        ended_at=a.ended_at,
                    )
                )
        return out

    def live_workers(self) -> list[dict[str, Any]] | None:
        workers = getattr(self.store, "workers", None)
        if workers is None:
            return None
        return [w.model_dump() if hasattr(w, "model_dump") else dict(w) for w in workers()]

    def change_token(self) -> object:
        heads = self._refresh()
        with self._lock:
            live = tuple((h.status, h.attempts) for h in heads[self._first_active :])
            return (len(heads), self._first_active, live)

    def close(self) -> None:
        """The store stays open: it belongs to the caller."""


def source_for(store: Store, label: str | None = None) -> Source:
    """The best source for a store object: SQL on its file for a SQLite store."""
    from boltrl.store.sqlite import SqliteStore

    if isinstance(store, SqliteStore):
        from boltrl.dashboard.sqlsource import SqliteSource

        return SqliteSource(store.path, workers=store.workers)
    url = getattr(store, "url", None)  # a served store's address (never its token)
    return StoreSource(store, label or (url if isinstance(url, str) else type(store).__name__))


def open_source(url: str, token: str | None = None) -> tuple[Source, Store | None]:
    """A source for a store URL, and the store it opened (the caller closes both).

    ``sqlite:///path.db`` is read directly and read-only (no store is opened, so a trainer
    may hold the file); other URLs open the store (``open_store``).
    """
    from boltrl.store import open_store

    if url.lower().startswith("sqlite://"):
        from boltrl.dashboard.sqlsource import SqliteSource

        rest = url.split("://", 1)[1]
        if not rest.startswith("/"):
            raise InvalidInput(f"store: {url!r} needs three slashes: sqlite:///path.db")
        return SqliteSource(urllib.parse.unquote(rest[1:].partition("?")[0])), None
    store = open_store(url, token)
    return StoreSource(store, url.split("@")[-1]), store
