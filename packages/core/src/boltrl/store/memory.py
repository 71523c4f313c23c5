"""The in-memory store: the shared lifecycle over plain dicts. For tests and one-process
runs where losing everything at exit is fine."""

from __future__ import annotations

import bisect
import itertools
from collections import Counter, OrderedDict

from boltrl.records import AnyRecord, Resources, RewardEvent, Rollout, RolloutStatus
from boltrl.store._engine import Once
from boltrl.store._sessions import SessionEngine

_SHARED_FIELD_SETS: dict[frozenset[str], set[str]] = {}
_MAX_SHARED = 256
_MAX_ONCE = 100_000
"""Idempotency keys of enqueues remembered (oldest forgotten first)."""


def _stored(record: AnyRecord, seq: int) -> AnyRecord:
    """``record.model_copy(update={"seq": seq})``, except that the copy's set of explicitly
    set fields is shared with every stored record that set the same fields.

    pydantic keeps that set per instance (~700 bytes for a model call: more than the dict
    of its values), and a store holds hundreds of thousands of records. Sharing it is
    safe because records are frozen: pydantic changes the set only on attribute
    assignment, and ``model_copy`` copies it before updating it.
    """
    names = frozenset(record.__pydantic_fields_set__ | {"seq"})
    fields = _SHARED_FIELD_SETS.get(names)
    if fields is None:
        fields = set(names)
        if len(_SHARED_FIELD_SETS) < _MAX_SHARED:
            _SHARED_FIELD_SETS[names] = fields
    copy = type(record).__new__(type(record))
    object.__setattr__(copy, "__dict__", {**record.__dict__, "seq": seq})
    object.__setattr__(copy, "__pydantic_fields_set__", fields)
    object.__setattr__(copy, "__pydantic_extra__", None)  # records forbid extra fields
    object.__setattr__(copy, "__pydantic_private__", None)  # and have no private ones
    return copy


class MemoryStore(SessionEngine):
    """A ``Store`` (and ``SessionStore``) held in process memory (``open_store("memory://")``).

    Keeps every promise of ``Store`` except durability: nothing survives the process.
    Records are stored as given (a shallow copy with ``seq`` set); do not mutate the
    lists inside a record after recording it.
    """

    def __init__(self) -> None:
        super().__init__()
        self._heads: dict[str, Rollout] = {}
        """Every rollout ever enqueued, in enqueue order (dicts keep insertion order)."""
        self._records: dict[str, dict[tuple[int, str], AnyRecord]] = {}
        """Per rollout: (attempt, record id) → record, in seq order."""
        self._seq = itertools.count(1)
        self._counts: Counter[RolloutStatus] = Counter()
        self._once: OrderedDict[str, Once] = OrderedDict()
        self._feedback: list[tuple[int, str]] = []
        """(seq, rollout id) of each session's feedback, in seq order."""

    def _p_insert(self, rows: list[tuple[int, Rollout]], once: Once | None = None) -> None:
        if once is not None:
            self._once[once.key] = once
            while len(self._once) > _MAX_ONCE:
                self._once.popitem(last=False)
        for _, head in rows:
            self._heads[head.id] = head
            self._records[head.id] = {}
            self._counts[head.status] += 1  # queued, or running for a session

    def _p_update(self, head: Rollout) -> None:
        old = self._heads[head.id]
        if old.status is not head.status:
            self._counts[old.status] -= 1
            self._counts[head.status] += 1
        self._heads[head.id] = head

    def _p_once(self, key: str) -> Once | None:
        return self._once.get(key)

    def _p_head(self, rollout_id: str) -> Rollout | None:
        return self._heads.get(rollout_id)

    def _p_add_records(self, rollout_id: str, records: list[AnyRecord]) -> None:
        stored = self._records[rollout_id]
        for r in records:
            key = (r.attempt, r.id)
            if key not in stored:  # first write wins, its seq kept
                stored[key] = _stored(r, next(self._seq))

    def _p_records(self, rollout_id: str) -> list[AnyRecord]:
        return list(self._records[rollout_id].values())

    def _p_query(self, status: RolloutStatus | None, limit: int, offset: int) -> list[Rollout]:
        heads = (h for h in self._heads.values() if status is None or h.status is status)
        return list(itertools.islice(heads, offset, offset + limit))

    def _p_count(self, status: RolloutStatus | None) -> int:
        return len(self._heads) if status is None else self._counts[status]

    def _p_feedback(self, head: Rollout, event: RewardEvent) -> None:
        self._p_add_records(head.id, [event])
        self._p_update(head)
        stored = self._records[head.id][(event.attempt, event.id)]
        self._feedback.append((stored.seq, head.id))

    def _p_feedback_since(self, after: int, limit: int) -> list[tuple[int, str]]:
        start = bisect.bisect_right(self._feedback, (after, "\uffff"))
        return self._feedback[start : start + limit]

    def _p_save_resources(self, resources: Resources) -> None:
        pass
