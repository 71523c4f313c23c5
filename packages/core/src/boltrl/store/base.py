"""The Store contract: where rollouts queue, run, and keep everything recorded about them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from boltrl.records import AnyRecord, Attempt, Resources, Rollout, RolloutStatus, Task

DEFAULT_LEASE_S = 30.0


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
