"""The Store contract: where rollouts queue, run, and keep everything recorded about them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict

from boltrl.records import JSON, AnyRecord, Attempt, Resources, Rollout, RolloutStatus, Task

DEFAULT_LEASE_S = 30.0
DEFAULT_FEEDBACK_TIMEOUT_S = 3600.0
"""How long a session waits for feedback after its last call, unless told otherwise."""


@runtime_checkable
class Store(Protocol):
    """A durable queue of rollouts and the records they produce.

    Promises every implementation keeps (the contract suite in ``tests/core`` checks them
    against memory, SQLite and HTTP alike):

    - **Thread-safe.** Any method may be called from any thread, concurrently.
    - **Blocking only where stated.** ``claim`` and ``wait`` block up to their timeout on a
      condition (or a long-poll over HTTP), never by busy polling; all other methods return
      promptly.
    - **Nothing lost.** A method that returned has made its effect durable (for the SQLite
      store: committed in WAL mode; survives kill -9 of the process).
    - **Idempotent records.** ``record`` keyed by record id: writing the same id again is a
      no-op, so retries never duplicate.
    - **Bad input changes nothing.** Unknown rollout → ``NotFound``; malformed record or
      non-finite reward → ``InvalidInput``; finishing an attempt twice (with another
      outcome), or an attempt whose lease was taken over → ``StaleAttempt``. The error
      message names what is wrong.
    - **Fenced attempts.** ``claim`` issues each attempt an unguessable lease token
      (``Attempt.token``); ``heartbeat``, ``record`` and ``finish`` refuse with
      ``StaleAttempt`` (HTTP 409) an attempt whose token does not match, and anything from
      an attempt that is not the rollout's current, running one. Nothing refused is
      stored. Reads (``get``, ``query``, ``wait``, ``current_attempt``, ``finish``'s
      answer) never include tokens.
    - **Lifecycle.** queued → running → succeeded | failed | cancelled. An attempt whose
      lease expires without heartbeat, or that finishes ``failed`` with ``retryable=True``,
      requeues the rollout (status ``requeued``) until ``max_attempts`` attempts were made;
      then the rollout is ``failed``. Each attempt's records stay separate (by number).
    """

    def enqueue(
        self,
        tasks: Sequence[Task],
        *,
        max_attempts: int = 3,
        timeout_s: float | None = None,
    ) -> list[str]:
        """Queue one rollout per task; returns their ids in order."""
        ...

    def claim(
        self, worker_id: str, *, lease_s: float = DEFAULT_LEASE_S, wait_s: float = 0.0
    ) -> Attempt | None:
        """Take the oldest queued rollout under a new attempt, with its ``task`` filled in.

        Blocks up to ``wait_s`` seconds for one to appear; None when none did.
        """
        ...

    def heartbeat(self, attempt: Attempt, *, lease_s: float | None = None) -> Attempt:
        """Extend the attempt's lease (by ``lease_s``, default its original length).

        Raises ``StaleAttempt`` when the attempt is no longer current.
        """
        ...

    def record(self, attempt: Attempt, records: Sequence[AnyRecord]) -> None:
        """Store records under the attempt (ids make it idempotent).

        Only while the attempt is the rollout's current, running one: records of an
        attempt that ended (finished, timed out, lost its lease) are refused with
        ``StaleAttempt``, so whatever an abandoned agent does later never reaches
        training data. Flush before ``finish``.
        """
        ...

    def current_attempt(self, rollout_id: str) -> Attempt:
        """The running attempt of a rollout, without its token (the gateway checks a
        call's attempt number against it before generating).

        Raises ``NotFound`` for an unknown rollout, ``Conflict`` when it is not running.
        """
        ...

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
        """End the attempt. ``status`` is ``succeeded``, ``failed`` or ``cancelled``.

        A ``failed`` attempt with ``retryable=True`` requeues the rollout while attempts
        remain. Returns the rollout as it now stands. Finishing again with the same token
        and outcome (a retry whose first answer was lost) answers the same way instead of
        raising ``StaleAttempt``.
        """
        ...

    def cancel(self, rollout_id: str) -> Rollout:
        """Cancel a rollout that has not finished (a running attempt is told on its next
        heartbeat)."""
        ...

    def get(self, rollout_id: str) -> Rollout:
        """The rollout with all its attempts and records (calls joined with annotations)."""
        ...

    def query(
        self,
        *,
        status: RolloutStatus | str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[Rollout]:
        """Rollouts in enqueue order, optionally by status (records not included)."""
        ...

    def count(self, *, status: RolloutStatus | str | None = None) -> int:
        """How many rollouts (optionally with the status) the store holds."""
        ...

    def wait(self, rollout_ids: Sequence[str], timeout_s: float) -> list[Rollout]:
        """Block until all the rollouts are terminal or the timeout passes; returns them
        (in the given order, with records) as they stand then."""
        ...

    def publish_resources(self, resources: Resources) -> Resources:
        """Publish where the model is served; returns it with its new ``version``."""
        ...

    def resources(self) -> Resources:
        """The last published resources (an empty ``Resources`` if none)."""
        ...

    def close(self) -> None:
        """Release connections and threads. Idempotent."""
        ...


class SessionPage(BaseModel):
    """One page of rewarded sessions (``SessionStore.rewarded_sessions``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rollouts: list[Rollout]
    """The sessions' rollouts, with all their records, in the order their feedback
    arrived."""
    cursor: int
    """Pass as ``after`` to get the sessions rewarded after these (the ``seq`` of the last
    one's feedback ``RewardEvent``; the ``after`` given when the page is empty)."""


@runtime_checkable
class SessionStore(Protocol):
    """Sessions: a deployed agent's conversations, each recorded as one rollout that stays
    open until its feedback arrives (or its deadline passes).

    A session is not queued and not claimed: its first model call creates its rollout,
    already ``running`` under one attempt (worker ``session``), id
    ``session_rollout_id(session_id)``, task ``{"session": id}`` with
    ``metadata["source"] == "live"``. Every call moves its deadline to
    ``feedback_timeout_s`` after the call (the attempt's ``lease_expires_at`` is the
    deadline). Then exactly one of:

    - **feedback** (``feedback``): the reward is stored as a final ``RewardEvent``
      (id ``feedback``, its ``name``) and as the rollout's ``reward``, and the rollout
      ``succeeded`` — in one commit. ``boltrl.scoring`` and credit assignment read it as
      the session's return; ``rewarded_sessions`` lists it.
    - **expiry**: no feedback by the deadline. The rollout is ``cancelled`` with
      ``error_kind == "no_feedback"`` on its attempt (outcome ``timeout``) and no reward:
      it has no score (not 0), and is never listed for training. Expiry is enforced
      lazily by every store call that reads or writes (so a late feedback is refused even
      if no sweep ran) and by ``expire_sessions``, which a server calls periodically.

    The promises of ``Store`` hold (thread-safe, durable once returned, bad input changes
    nothing, errors name the problem); a persistent store keeps open sessions and their
    deadlines across a restart. Errors: a malformed session id or reward →
    ``InvalidInput``; an unknown session → ``NotFound``; a session that already ended →
    ``SessionClosed`` (409); one that expired → ``SessionExpired`` (410).
    """

    def touch_session(
        self,
        session_id: str,
        *,
        feedback_timeout_s: float = DEFAULT_FEEDBACK_TIMEOUT_S,
        metadata: JSON | None = None,
    ) -> Attempt:
        """The running attempt of the session, created on first use (with ``metadata``
        in its task's metadata) and its deadline moved to ``feedback_timeout_s`` from
        now. The answer carries the attempt's lease token: record the session's calls
        with it (``record``). For the gateway, which holds the only session tokens."""
        ...

    def feedback(self, session_id: str, reward: float, *, name: str | None = None) -> Rollout:
        """Reward the session and close it (``succeeded``); returns the rollout with its
        records. ``name`` defaults to ``feedback``."""
        ...

    def rewarded_sessions(self, *, after: int = 0, limit: int = 100) -> SessionPage:
        """Sessions whose feedback arrived after cursor ``after``, oldest first, at most
        ``limit``, each with all its records (what a learner trains on)."""
        ...

    def expire_sessions(self) -> int:
        """Close every open session past its deadline now; returns how many it closed."""
        ...
