"""The rollout lifecycle that every embedded store shares: queue, leases, retries.

``StoreEngine`` keeps the *live* part of the store in memory — rollouts that are queued
or running, a heap of queued rollouts by enqueue order, a heap of lease expiry times —
and leaves everything durable to a small set of ``_p_*`` persistence hooks that the
memory and SQLite stores implement. One lock guards it all; ``claim`` and ``wait`` block
on conditions of that lock, with a timeout cut short at the next lease expiry so an
expired lease is noticed without polling.

Every state change is computed as new (immutable) values first, handed to persistence,
and only then installed in memory: when persistence raises, memory is unchanged, which
is how "bad input changes nothing" and "acknowledged means durable" hold together.

Fencing: ``claim`` gives each attempt an unguessable lease token (kept in the stored
head, so a running attempt keeps it across a restart of a persistent store); every
write checks it, and every rollout or attempt handed out by a read has it removed, so
only the worker that claimed an attempt can act for it.
"""

from __future__ import annotations

import abc
import heapq
import hmac
import math
import secrets
import threading
import time
from collections.abc import Iterable, Sequence

from pydantic import BaseModel, ConfigDict

from boltrl.errors import Conflict, InvalidInput, NotFound, StaleAttempt, StoreUnavailable
from boltrl.join import assemble
from boltrl.records import (
    AnyRecord,
    Attempt,
    AttemptOutcome,
    Resources,
    Rollout,
    RolloutStatus,
    Task,
    new_id,
)
from boltrl.store._checks import (
    check_int,
    check_number,
    check_optional_status,
    check_readable,
    check_records,
    check_status,
    check_tasks,
)
from boltrl.store.base import DEFAULT_LEASE_S

_QUEUED = (RolloutStatus.QUEUED, RolloutStatus.REQUEUED)
_FINISH_STATUSES = (RolloutStatus.SUCCEEDED, RolloutStatus.FAILED, RolloutStatus.CANCELLED)


class WorkerInfo(BaseModel):
    """A worker as the store last saw it (in memory only; a restarted store forgets)."""

    model_config = ConfigDict(frozen=True)

    worker_id: str
    last_seen: float
    """Unix time of its last claim, heartbeat or finish."""
    running: list[str]
    """Rollouts it currently holds a running attempt of."""


class Once(BaseModel):
    """An enqueue done under an idempotency key (kept by the store, durably if it is)."""

    model_config = ConfigDict(frozen=True)

    key: str
    request_hash: str
    """Digest of the request it was made with: the key answers that request only."""
    ids: list[str]


class StoreEngine(abc.ABC):
    """Lifecycle logic over abstract persistence. Thread-safe; see ``Store`` for promises.

    Subclasses implement the ``_p_*`` hooks (called with the lock held; each must either
    make its whole effect durable or raise having changed nothing) and call ``_restore``
    from their constructor with what they already hold.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._claimable = threading.Condition(self._lock)
        self._changed = threading.Condition(self._lock)
        self._active: dict[str, Rollout] = {}
        """Rollouts not yet terminal, by id (records not included)."""
        self._ord: dict[str, int] = {}
        """Enqueue order of active rollouts; the queue claims the oldest first."""
        self._next_ord = 1
        self._queue: list[tuple[int, str]] = []
        self._leases: list[tuple[float, str, int]] = []
        """(lease expiry, rollout id, attempt number); stale entries are skipped on pop."""
        self._workers: dict[str, float] = {}
        self._resources = Resources()
        self._closed = False

    # -- persistence hooks ----------------------------------------------------------------

    @abc.abstractmethod
    def _p_insert(self, rows: list[tuple[int, Rollout]], once: Once | None = None) -> None:
        """Insert rollouts; with ``once``, remember its key in the same transaction."""

    @abc.abstractmethod
    def _p_once(self, key: str) -> Once | None:
        """The enqueue remembered under an idempotency key, if any."""

    @abc.abstractmethod
    def _p_update(self, head: Rollout) -> None: ...

    @abc.abstractmethod
    def _p_head(self, rollout_id: str) -> Rollout | None: ...

    @abc.abstractmethod
    def _p_add_records(self, rollout_id: str, records: list[AnyRecord]) -> None:
        """Insert records not yet stored under (rollout, attempt, id), assigning seq."""

    @abc.abstractmethod
    def _p_records(self, rollout_id: str) -> list[AnyRecord]:
        """All records of the rollout in seq order, seq filled in."""

    @abc.abstractmethod
    def _p_query(self, status: RolloutStatus | None, limit: int, offset: int) -> list[Rollout]: ...

    @abc.abstractmethod
    def _p_count(self, status: RolloutStatus | None) -> int: ...

    @abc.abstractmethod
    def _p_save_resources(self, resources: Resources) -> None: ...

    def _p_close(self) -> None:  # noqa: B027 - optional hook
        pass

    def _restore(
        self, active: Iterable[tuple[int, Rollout]], resources: Resources, next_ord: int
    ) -> None:
        """Load live state a persistent store already holds (at open); ``next_ord`` is
        one past the highest enqueue order ever used, terminal rollouts included."""
        self._next_ord = next_ord
        for order, head in active:
            self._active[head.id] = head
            self._ord[head.id] = order
            if head.status in _QUEUED:
                self._queue.append((order, head.id))
            elif head.attempts and head.attempts[-1].outcome is AttemptOutcome.RUNNING:
                # A running attempt keeps its lease across a restart: if its worker is
                # still alive it heartbeats on; if not, the lease expires and requeues.
                att = head.attempts[-1]
                self._leases.append((att.lease_expires_at, head.id, att.number))
        heapq.heapify(self._queue)
        heapq.heapify(self._leases)
        self._resources = resources

    # -- helpers (lock held) --------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise StoreUnavailable("the store is closed")

    def _head(self, rollout_id: str) -> Rollout:
        if not isinstance(rollout_id, str):
            raise InvalidInput(f"rollout_id: expected a string, got {type(rollout_id).__name__}")
        head = self._active.get(rollout_id) or self._p_head(rollout_id)
        if head is None:
            raise NotFound(f"unknown rollout {rollout_id!r}")
        return head

    def _fenced(self, attempt: Attempt, action: str) -> tuple[Rollout, Attempt]:
        """The head and the stored attempt ``attempt`` names, once its lease token matches;
        else StaleAttempt (the attempt did not come from ``claim``, or not this one)."""
        if not isinstance(attempt, Attempt):
            raise InvalidInput(f"attempt: expected an Attempt, got {type(attempt).__name__}")
        head = self._head(attempt.rollout_id)
        n = len(head.attempts)
        if attempt.number > n:
            raise NotFound(f"rollout {head.id!r} has no attempt {attempt.number}")
        stored = head.attempts[attempt.number - 1]
        if not same_token(stored.token, attempt.token):
            raise StaleAttempt(
                f"cannot {action}: attempt {attempt.number} of rollout {head.id!r} "
                f"{'carries no' if not attempt.token else 'carries the wrong'} lease token "
                "(only the Attempt that claim returned may act for it)"
            )
        return head, stored

    def _current(self, attempt: Attempt, action: str) -> Rollout:
        """The live head whose current, running attempt is ``attempt``; else StaleAttempt."""
        head, stored = self._fenced(attempt, action)
        n = len(head.attempts)
        if stored.outcome is not AttemptOutcome.RUNNING:
            cause = stored.outcome.value
            if stored.error_kind not in (None, cause):
                cause += f": {stored.error_kind}"
            later = f"; attempt {n} took over" if attempt.number < n else ""
            raise StaleAttempt(
                f"cannot {action}: attempt {attempt.number} of rollout {head.id!r} "
                f"already ended ({cause}){later}"
            )
        return head

    def _install(self, head: Rollout) -> None:
        """Persist ``head`` and make it the live state (or retire it when terminal)."""
        self._p_update(head)
        if head.status.terminal:
            self._active.pop(head.id, None)
            self._ord.pop(head.id, None)
            self._changed.notify_all()
        else:
            self._active[head.id] = head

    def _end_attempt(
        self,
        head: Rollout,
        now: float,
        status: RolloutStatus,
        outcome: AttemptOutcome,
        *,
        reward: float | None = None,
        error: str | None = None,
        error_kind: str | None = None,
        retryable: bool = False,
    ) -> Rollout:
        ended = head.attempts[-1].model_copy(
            update={"outcome": outcome, "ended_at": now, "error": error, "error_kind": error_kind}
        )
        attempts = [*head.attempts[:-1], ended]
        if status is RolloutStatus.FAILED and retryable and len(attempts) < head.max_attempts:
            new = head.model_copy(
                update={"status": RolloutStatus.REQUEUED, "attempts": attempts, "error": error}
            )
            self._install(new)
            heapq.heappush(self._queue, (self._ord[head.id], head.id))
            self._claimable.notify()
            return new
        if status is RolloutStatus.FAILED and retryable:
            error = f"gave up after {len(attempts)} attempt(s): {error}"
        new = head.model_copy(
            update={
                "status": status,
                "attempts": attempts,
                "finished_at": now,
                "reward": reward,
                "error": error if status is not RolloutStatus.SUCCEEDED else None,
            }
        )
        self._install(new)
        return new

    def _expire_due(self, now: float) -> None:
        """Requeue (or fail) rollouts whose current attempt's lease has passed."""
        while self._leases and self._leases[0][0] <= now:
            entry = heapq.heappop(self._leases)
            _, rid, number = entry
            head = self._active.get(rid)
            if head is None or len(head.attempts) != number:
                continue
            att = head.attempts[-1]
            if att.outcome is not AttemptOutcome.RUNNING or att.lease_expires_at > now:
                continue  # finished, or a heartbeat pushed a later entry
            try:
                self._lease_expired(head, now)
            except BaseException:
                heapq.heappush(self._leases, entry)
                raise

    def _lease_expired(self, head: Rollout, now: float) -> None:
        """End ``head``'s running attempt whose lease passed: a retry while attempts
        remain (a subclass may end other kinds of rollout otherwise)."""
        att = head.attempts[-1]
        self._end_attempt(
            head,
            now,
            RolloutStatus.FAILED,
            AttemptOutcome.LEASE_EXPIRED,
            error=f"lease of worker {att.worker_id!r} expired without a heartbeat",
            error_kind="lease_expired",
            retryable=True,
        )

    def _wait_timeout(self, remaining: float, now: float) -> float:
        """How long a blocked caller may sleep: until its deadline or the next expiry."""
        if self._leases:
            remaining = min(remaining, max(0.0, self._leases[0][0] - now) + 0.001)
        return remaining

    def _pop_queued(self) -> str | None:
        while self._queue:
            _, rid = heapq.heappop(self._queue)
            head = self._active.get(rid)
            if head is not None and head.status in _QUEUED:
                return rid
        return None

    def _start_attempt(self, rid: str, worker_id: str, lease_s: float, now: float) -> Attempt:
        head = self._active[rid]
        att = Attempt(
            rollout_id=rid,
            number=len(head.attempts) + 1,
            worker_id=worker_id,
            started_at=now,
            lease_expires_at=now + lease_s,
            last_heartbeat=now,
            token=secrets.token_urlsafe(24),
        )
        new = head.model_copy(
            update={"status": RolloutStatus.RUNNING, "attempts": [*head.attempts, att]}
        )
        try:
            self._install(new)
        except BaseException:
            heapq.heappush(self._queue, (self._ord[rid], rid))
            raise
        heapq.heappush(self._leases, (att.lease_expires_at, rid, att.number))
        return att.model_copy(update={"task": head.task, "timeout_s": head.timeout_s})

    # -- the Store API --------------------------------------------------------------------

    def enqueue(
        self,
        tasks: Sequence[Task],
        *,
        max_attempts: int = 3,
        timeout_s: float | None = None,
        idempotency: tuple[str, str] | None = None,
    ) -> list[str]:
        """``Store.enqueue``; with ``idempotency=(key, request_hash)`` an enqueue is done
        at most once per key, durably (remembered in the same transaction as the
        rollouts): a repeat with the same request answers the first one's ids, a repeat
        with another request is ``InvalidInput``. The store server passes its
        ``Idempotency-Key`` header this way."""
        checked = check_tasks(tasks)
        check_int("max_attempts", max_attempts, minimum=1)
        if timeout_s is not None:
            timeout_s = check_number("timeout_s", timeout_s, strict=True)
        now = time.time()
        heads = [
            Rollout(
                id=new_id("ro"),
                task=t,
                status=RolloutStatus.QUEUED,
                max_attempts=max_attempts,
                timeout_s=timeout_s,
                created_at=now,
            )
            for t in checked
        ]
        with self._lock:
            self._check_open()
            once = None
            if idempotency is not None:
                key, digest = idempotency
                prior = self._p_once(key)
                if prior is not None:
                    if prior.request_hash != digest:
                        raise InvalidInput(
                            f"Idempotency-Key {key!r} was first used for another request"
                        )
                    return list(prior.ids)
                once = Once(key=key, request_hash=digest, ids=[h.id for h in heads])
            rows = [(self._next_ord + i, h) for i, h in enumerate(heads)]
            self._p_insert(rows, once)
            self._next_ord += len(rows)
            for order, h in rows:
                self._active[h.id] = h
                self._ord[h.id] = order
                heapq.heappush(self._queue, (order, h.id))
            self._claimable.notify(len(rows))
        return [h.id for h in heads]

    def claim(
        self, worker_id: str, *, lease_s: float = DEFAULT_LEASE_S, wait_s: float = 0.0
    ) -> Attempt | None:
        if not isinstance(worker_id, str) or not worker_id:
            raise InvalidInput(f"worker_id: must be a non-empty string, got {worker_id!r}")
        lease_s = check_number("lease_s", lease_s, strict=True)
        wait_s = check_number("wait_s", wait_s)
        deadline = time.monotonic() + wait_s
        with self._lock:
            while True:
                self._check_open()
                now = time.time()
                self._expire_due(now)
                self._workers[worker_id] = now
                rid = self._pop_queued()
                if rid is not None:
                    return self._start_attempt(rid, worker_id, lease_s, now)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._claimable.wait(self._wait_timeout(remaining, now))

    def heartbeat(self, attempt: Attempt, *, lease_s: float | None = None) -> Attempt:
        if lease_s is not None:
            lease_s = check_number("lease_s", lease_s, strict=True)
        with self._lock:
            self._check_open()
            now = time.time()
            self._expire_due(now)
            head = self._current(attempt, "heartbeat")
            stored = head.attempts[-1]
            # The lease length of the claim (or last heartbeat) is expiry minus last beat.
            length = (
                lease_s if lease_s is not None else stored.lease_expires_at - stored.last_heartbeat
            )
            beat = stored.model_copy(
                update={"last_heartbeat": now, "lease_expires_at": now + length}
            )
            self._install(head.model_copy(update={"attempts": [*head.attempts[:-1], beat]}))
            heapq.heappush(self._leases, (beat.lease_expires_at, head.id, beat.number))
            self._workers[stored.worker_id] = now
            return beat.model_copy(update={"task": attempt.task, "timeout_s": attempt.timeout_s})

    def record(self, attempt: Attempt, records: Sequence[AnyRecord]) -> None:
        if not isinstance(attempt, Attempt):
            raise InvalidInput(f"attempt: expected an Attempt, got {type(attempt).__name__}")
        with self._lock:
            self._check_open()
            self._expire_due(time.time())
            head = self._current(attempt, "record")
            checked = check_records(head, attempt.number, records)
            if checked:
                self._p_add_records(head.id, checked)

    def current_attempt(self, rollout_id: str) -> Attempt:
        with self._lock:
            self._check_open()
            self._expire_due(time.time())
            head = self._head(rollout_id)
            if head.status is not RolloutStatus.RUNNING:
                raise Conflict(f"rollout {rollout_id!r} is not running (it is {head.status.value})")
            return head.attempts[-1].model_copy(update={"token": None})

    def finish(
        self,
        attempt: Attempt,
        status: RolloutStatus | str,
        *,
        reward: float | None = None,
        error: str | None = None,
        error_kind: str | None = None,
        retryable: bool = False,
    ) -> Rollout:
        st = check_status("status", status, _FINISH_STATUSES)
        if reward is not None:
            reward = check_number("reward", reward, minimum=-math.inf)
        for name, val in (("error", error), ("error_kind", error_kind)):
            if val is not None and not isinstance(val, str):
                raise InvalidInput(f"{name}: expected a string, got {type(val).__name__}")
            check_readable(name, val)  # a lone surrogate would not read back
        outcome = AttemptOutcome(st.value)
        if st is RolloutStatus.FAILED and error_kind == "timeout":
            outcome = AttemptOutcome.TIMEOUT
        with self._lock:
            self._check_open()
            now = time.time()
            self._expire_due(now)
            head, stored = self._fenced(attempt, "finish")
            if stored.outcome is outcome and stored.ended_at is not None:
                # A retried finish whose first try committed (its answer was lost): the
                # same answer again, not StaleAttempt.
                return public(assemble(head, self._p_records(head.id)))
            head = self._current(attempt, "finish")
            self._workers[head.attempts[-1].worker_id] = now
            new = self._end_attempt(
                head,
                now,
                st,
                outcome,
                reward=reward,
                error=error,
                error_kind=error_kind,
                retryable=bool(retryable),
            )
            return public(assemble(new, self._p_records(new.id)))

    def cancel(self, rollout_id: str) -> Rollout:
        with self._lock:
            self._check_open()
            now = time.time()
            self._expire_due(now)
            head = self._head(rollout_id)
            if head.status is RolloutStatus.CANCELLED:
                return public(assemble(head, self._p_records(head.id)))
            if head.status.terminal:
                raise Conflict(f"rollout {rollout_id!r} already {head.status.value}")
            attempts = head.attempts
            if attempts and attempts[-1].outcome is AttemptOutcome.RUNNING:
                upd = {
                    "outcome": AttemptOutcome.CANCELLED,
                    "ended_at": now,
                    "error_kind": "cancelled",
                }
                attempts = [*attempts[:-1], attempts[-1].model_copy(update=upd)]
            new = head.model_copy(
                update={
                    "status": RolloutStatus.CANCELLED,
                    "attempts": attempts,
                    "finished_at": now,
                    "error": "cancelled",
                }
            )
            self._install(new)
            return public(assemble(new, self._p_records(new.id)))

    def get(self, rollout_id: str) -> Rollout:
        with self._lock:
            self._check_open()
            self._expire_due(time.time())
            head = self._head(rollout_id)
            return public(assemble(head, self._p_records(head.id)))

    def query(
        self, *, status: RolloutStatus | str | None = None, limit: int = 100, offset: int = 0
    ) -> list[Rollout]:
        st = check_optional_status(status)
        check_int("limit", limit, minimum=0)
        check_int("offset", offset, minimum=0)
        with self._lock:
            self._check_open()
            self._expire_due(time.time())
            return [public(h) for h in self._p_query(st, limit, offset)]

    def count(self, *, status: RolloutStatus | str | None = None) -> int:
        st = check_optional_status(status)
        with self._lock:
            self._check_open()
            self._expire_due(time.time())
            return self._p_count(st)

    def wait(self, rollout_ids: Sequence[str], timeout_s: float) -> list[Rollout]:
        if isinstance(rollout_ids, str) or not isinstance(rollout_ids, Sequence):
            raise InvalidInput("rollout_ids: expected a list of rollout ids")
        timeout_s = check_number("timeout_s", timeout_s)
        deadline = time.monotonic() + timeout_s
        with self._lock:
            self._check_open()
            for rid in rollout_ids:
                self._head(rid)  # NotFound before blocking
            while True:
                now = time.time()
                self._expire_due(now)
                if not any(rid in self._active for rid in rollout_ids):
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._changed.wait(self._wait_timeout(remaining, now))
                self._check_open()
            return [
                public(assemble(h, self._p_records(h.id))) for h in map(self._head, rollout_ids)
            ]

    def release(self, attempt: Attempt) -> None:
        """Undo a claim whose answer never reached its worker (a long-poll client that
        disconnected): the attempt is removed as if never made and the rollout goes back
        to the head of the queue, so no attempt is spent. A no-op when the attempt has
        already heartbeaten, recorded or ended; StaleAttempt for a wrong token."""
        with self._lock:
            self._check_open()
            head, stored = self._fenced(attempt, "release")
            if (
                stored.number != len(head.attempts)
                or stored.outcome is not AttemptOutcome.RUNNING
                or stored.last_heartbeat != stored.started_at
                or any(r.attempt == stored.number for r in self._p_records(head.id))
            ):
                return
            attempts = head.attempts[:-1]
            status = RolloutStatus.REQUEUED if attempts else RolloutStatus.QUEUED
            self._install(head.model_copy(update={"status": status, "attempts": attempts}))
            heapq.heappush(self._queue, (self._ord[head.id], head.id))
            self._claimable.notify()

    def publish_resources(self, resources: Resources) -> Resources:
        if not isinstance(resources, Resources):
            raise InvalidInput(f"resources: expected Resources, got {type(resources).__name__}")
        check_readable("resources", resources)  # NaN sampling would be stored as null
        with self._lock:
            self._check_open()
            new = resources.model_copy(update={"version": self._resources.version + 1})
            self._p_save_resources(new)
            self._resources = new
            return new

    def resources(self) -> Resources:
        with self._lock:
            self._check_open()
            return self._resources

    def workers(self) -> list[WorkerInfo]:
        """Workers seen by this store (claim, heartbeat, finish), most recent first."""
        with self._lock:
            self._check_open()
            running: dict[str, list[str]] = {}
            for head in self._active.values():
                if head.status is RolloutStatus.RUNNING:
                    running.setdefault(head.attempts[-1].worker_id, []).append(head.id)
            return [
                WorkerInfo(worker_id=w, last_seen=t, running=running.get(w, []))
                for w, t in sorted(self._workers.items(), key=lambda kv: -kv[1])
            ]

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._claimable.notify_all()
            self._changed.notify_all()
            self._p_close()

    def __enter__(self) -> StoreEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def same_token(stored: str | None, given: str | None) -> bool:
    """Whether a lease token matches (constant time; a missing token never matches)."""
    if not stored or not isinstance(given, str) or not given:
        return False
    return hmac.compare_digest(stored.encode(), given.encode())


def public(rollout: Rollout) -> Rollout:
    """The rollout as reads hand it out: without its attempts' lease tokens."""
    if not any(a.token for a in rollout.attempts):
        return rollout
    attempts = [a.model_copy(update={"token": None}) if a.token else a for a in rollout.attempts]
    return rollout.model_copy(update={"attempts": attempts})
