"""Sessions in the embedded stores: live conversations recorded as rollouts that wait for
feedback (the ``SessionStore`` contract in ``store.base``).

A session reuses the rollout lifecycle rather than adding one: its rollout is created
``running`` under a single attempt whose lease is the feedback deadline. Each call moves
the lease; feedback finishes the attempt ``succeeded``; a lease that passes goes through
the engine's one expiry path (``_expire_due``: lazily on every store call, and on
``expire_sessions``), which for a session ends it ``cancelled`` / ``no_feedback`` instead
of retrying. So deadlines survive a restart exactly as leases do, and no second timer or
table can disagree with the rollout.
"""

from __future__ import annotations

import heapq
import math
import re
import secrets
import time
from typing import Any, Literal

from boltrl.errors import InvalidInput, NotFound, SessionClosed, SessionExpired
from boltrl.join import assemble
from boltrl.records import (
    JSON,
    Attempt,
    AttemptOutcome,
    RewardEvent,
    Rollout,
    RolloutStatus,
    Task,
)
from boltrl.store._checks import check_int, check_number, check_readable
from boltrl.store._engine import StoreEngine, public
from boltrl.store.base import DEFAULT_FEEDBACK_TIMEOUT_S, SessionPage

__all__ = [
    "FEEDBACK_ID",
    "LIVE_SOURCE",
    "NO_FEEDBACK",
    "SESSION_ID_RULE",
    "SESSION_PREFIX",
    "SESSION_WORKER",
    "SessionEngine",
    "SessionState",
    "check_feedback",
    "check_session_id",
    "session_rollout_id",
    "session_state",
]

SESSION_ID_RULE = "[A-Za-z0-9._:-]{1,128}"
"""What a client-chosen session id may be: URL-safe without escaping, and short."""
_SESSION_ID = re.compile(SESSION_ID_RULE)
SESSION_PREFIX = "session-"
"""A session's rollout id is this + the session id (enqueued rollouts are ``ro-…``)."""
SESSION_WORKER = "session"
"""The ``worker_id`` of a session's attempt (no runner holds it)."""
LIVE_SOURCE = "live"
"""``Task.metadata["source"]`` of a session: recorded from live traffic."""
FEEDBACK_ID = "feedback"
"""Record id of a session's feedback ``RewardEvent`` (one per session, by construction)."""
NO_FEEDBACK = "no_feedback"
"""``Attempt.error_kind`` of a session closed because no feedback came by its deadline."""

SessionState = Literal["open", "rewarded", "expired", "cancelled"]


def check_session_id(session_id: Any) -> str:
    """``session_id`` when it follows ``SESSION_ID_RULE``, else InvalidInput naming it."""
    if not isinstance(session_id, str) or not _SESSION_ID.fullmatch(session_id):
        shown = session_id if not isinstance(session_id, str) else session_id[:140]
        raise InvalidInput(
            f"session_id: must match {SESSION_ID_RULE} (1 to 128 letters, digits, '.', '_', "
            f"':' or '-'), got {shown!r}"
        )
    return session_id


def check_feedback(reward: Any, name: Any) -> tuple[float, str]:
    """The reward (a finite number, not a bool) and name (a non-empty string, default
    ``feedback``) of a feedback, else InvalidInput naming the field."""
    if isinstance(reward, bool) or not isinstance(reward, int | float):
        raise InvalidInput(f"reward: expected a number, got {type(reward).__name__} {reward!r}")
    if not math.isfinite(reward):
        raise InvalidInput(f"reward: must be a finite number, got {reward!r}")
    if name is None:
        name = FEEDBACK_ID
    if not isinstance(name, str) or not name or len(name) > 256:
        raise InvalidInput(f"name: expected a string of 1 to 256 characters, got {name!r}")
    check_readable("name", name)
    return float(reward), name


def session_rollout_id(session_id: str) -> str:
    """The rollout id a session is recorded under (InvalidInput for a malformed id)."""
    return SESSION_PREFIX + check_session_id(session_id)


def session_state(rollout: Rollout) -> SessionState | None:
    """Where a session's rollout stands: ``open`` (waiting for feedback), ``rewarded``,
    ``expired`` (no feedback by its deadline: not a score of 0, never trained on) or
    ``cancelled``; None for a rollout that is not a session."""
    if not rollout.id.startswith(SESSION_PREFIX) or rollout.task.metadata.get("source") != (
        LIVE_SOURCE
    ):
        return None
    if not rollout.status.terminal:
        return "open"
    if rollout.status is RolloutStatus.SUCCEEDED:
        return "rewarded"
    if rollout.attempts and rollout.attempts[-1].error_kind == NO_FEEDBACK:
        return "expired"
    return "cancelled"


def _closed(session_id: str, head: Rollout) -> Exception:
    """Why an ended session takes no more calls or feedback."""
    state = session_state(head)
    if state == "expired":
        return SessionExpired(f"session {session_id!r} expired: {head.error}")
    if state == "rewarded":
        return SessionClosed(f"session {session_id!r} already received its feedback")
    return SessionClosed(f"session {session_id!r} is closed ({head.status.value})")


class SessionEngine(StoreEngine):
    """``StoreEngine`` + ``SessionStore`` (see ``store.base.SessionStore`` for promises).

    Subclasses add two persistence hooks: ``_p_feedback`` (the closed head and its
    feedback record in one commit) and ``_p_feedback_since`` (the cursor query).
    """

    def __init__(self) -> None:
        super().__init__()
        self._expired = 0
        """Sessions this store object closed for want of feedback (``expire_sessions``)."""

    def _p_feedback(self, head: Rollout, event: RewardEvent) -> None:
        """Store ``event`` and the closed ``head`` together, or neither (this default is
        for stores whose two writes cannot fail apart)."""
        self._p_add_records(head.id, [event])
        self._p_update(head)

    def _p_feedback_since(self, after: int, limit: int) -> list[tuple[int, str]]:
        """``(seq, rollout_id)`` of feedback events with ``seq > after``, by seq."""
        raise NotImplementedError

    # -- the SessionStore API -------------------------------------------------------------

    def touch_session(
        self,
        session_id: str,
        *,
        feedback_timeout_s: float = DEFAULT_FEEDBACK_TIMEOUT_S,
        metadata: JSON | None = None,
    ) -> Attempt:
        rid = session_rollout_id(session_id)
        timeout = check_number("feedback_timeout_s", feedback_timeout_s, strict=True)
        if metadata is not None:
            if not isinstance(metadata, dict):
                raise InvalidInput(f"metadata: expected a JSON object, got {metadata!r}")
            check_readable("metadata", metadata)
        with self._lock:
            self._check_open()
            now = time.time()
            self._expire_due(now)
            head = self._active.get(rid) or self._p_head(rid)
            if head is None:
                return self._open_session(session_id, rid, now, timeout, metadata or {})
            if head.status.terminal:
                raise _closed(session_id, head)
            att = head.attempts[-1]
            moved = att.model_copy(
                update={"last_heartbeat": now, "lease_expires_at": now + timeout}
            )
            self._install(head.model_copy(update={"attempts": [*head.attempts[:-1], moved]}))
            heapq.heappush(self._leases, (moved.lease_expires_at, rid, moved.number))
            return moved.model_copy(update={"task": head.task})

    def _open_session(
        self, session_id: str, rid: str, now: float, timeout: float, metadata: JSON
    ) -> Attempt:
        """Create the session's rollout, running under attempt 1 (lock held)."""
        task = Task(
            id=rid,
            input={"session": session_id},
            metadata={**metadata, "source": LIVE_SOURCE, "session": session_id},
        )
        att = Attempt(
            rollout_id=rid,
            number=1,
            worker_id=SESSION_WORKER,
            started_at=now,
            lease_expires_at=now + timeout,
            last_heartbeat=now,
            token=secrets.token_urlsafe(24),
        )
        head = Rollout(
            id=rid,
            task=task,
            status=RolloutStatus.RUNNING,
            max_attempts=1,
            created_at=now,
            attempts=[att],
        )
        order = self._next_ord
        self._p_insert([(order, head)])
        self._next_ord += 1
        self._active[rid], self._ord[rid] = head, order
        heapq.heappush(self._leases, (att.lease_expires_at, rid, 1))
        return att.model_copy(update={"task": task})

    def feedback(self, session_id: str, reward: float, *, name: str | None = None) -> Rollout:
        rid = session_rollout_id(session_id)
        value, label = check_feedback(reward, name)
        with self._lock:
            self._check_open()
            now = time.time()
            self._expire_due(now)
            head = self._active.get(rid) or self._p_head(rid)
            if head is None:
                raise NotFound(f"unknown session {session_id!r}")
            if head.status.terminal:
                raise _closed(session_id, head)
            event = RewardEvent(
                id=FEEDBACK_ID,
                rollout_id=rid,
                attempt=head.attempts[-1].number,
                value=value,
                name=label,
                timestamp=now,
                final=True,
                index=len(self._p_records(rid)),
            )
            ended = head.attempts[-1].model_copy(
                update={"outcome": AttemptOutcome.SUCCEEDED, "ended_at": now}
            )
            new = head.model_copy(
                update={
                    "status": RolloutStatus.SUCCEEDED,
                    "attempts": [*head.attempts[:-1], ended],
                    "finished_at": now,
                    "reward": value,
                    "error": None,
                }
            )
            self._p_feedback(new, event)
            self._active.pop(rid, None)
            self._ord.pop(rid, None)
            self._changed.notify_all()
            return public(assemble(new, self._p_records(rid)))

    def rewarded_sessions(self, *, after: int = 0, limit: int = 100) -> SessionPage:
        check_int("after", after, minimum=0)
        check_int("limit", limit, minimum=0, maximum=10_000)
        with self._lock:
            self._check_open()
            self._expire_due(time.time())
            rows = self._p_feedback_since(after, limit)
            found: list[Rollout] = []
            for _, rid in rows:
                head = self._p_head(rid)
                assert head is not None  # feedback is written with its head
                found.append(public(assemble(head, self._p_records(rid))))
            return SessionPage(rollouts=found, cursor=rows[-1][0] if rows else after)

    def expire_sessions(self) -> int:
        with self._lock:
            self._check_open()
            before = self._expired
            self._expire_due(time.time())
            return self._expired - before

    # -- expiry (the engine's one lease path) ---------------------------------------------

    def _lease_expired(self, head: Rollout, now: float) -> None:
        if session_state(head) is None:
            super()._lease_expired(head, now)
            return
        att = head.attempts[-1]
        waited = att.lease_expires_at - att.last_heartbeat
        self._end_attempt(
            head,
            now,
            RolloutStatus.CANCELLED,
            AttemptOutcome.TIMEOUT,
            error=f"no feedback by deadline ({waited:g} s after the last call)",
            error_kind=NO_FEEDBACK,
        )
        self._expired += 1
