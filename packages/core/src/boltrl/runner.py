"""Runners: claim rollouts from a store and run the user's agent on them.

An agent is a plain function ``agent(task_input: dict, llm: boltrl.LLM) -> float | None``,
sync or async. The runner builds the rollout-scoped ``LLM`` from the store's published
resources, runs the agent inside a ``RolloutContext`` (so ``emit_reward`` and adapters
reach the rollout), heartbeats while it runs, enforces the rollout's ``timeout_s``, and
reports the outcome: a returned number is the final reward, an exception a failed
attempt with its traceback.

Isolation (``isolation=``):

- ``"thread"`` (the default, what the in-process trainer uses): each rollout's agent
  runs in its own thread (an async agent in its own event loop in that thread) while a
  supervising slot thread heartbeats, watches the clock and, on a timeout, abandons it.
  A Python thread cannot be killed: an abandoned sync agent keeps running until it
  returns, but whatever it records afterwards is dropped (its context is closed, and the
  store refuses writes of an attempt that ended).
- ``"process"`` (the default of ``boltrl runner``): each slot runs its agent in a worker
  process that is reused across rollouts and replaced when it dies (see
  ``boltrl._workers``), so ``os._exit``, a segfault or the OOM killer fails only that
  rollout (``error_kind="worker_died"``, retried); a rollout that killed its worker
  ``poison_after`` times (counted over all runners, from the store) fails for good with
  ``error_kind="poison"``. A timed-out or abandoned agent's process is killed.

Every rollout has a wall-clock budget: its own ``timeout_s``, else the runner's
``default_timeout_s`` (``DEFAULT_TIMEOUT_S`` = 30 minutes), so a hung agent cannot hold a
slot forever.
"""

from __future__ import annotations

import contextvars
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from boltrl._agent_run import AgentFn as AgentFn
from boltrl._agent_run import Retryable as Retryable
from boltrl._agent_run import _AgentRun, _as_reward, _default_retryable
from boltrl._agent_run import freeze_long_lived as freeze_long_lived
from boltrl._workers import AgentLoadError, ProcessRun, SlotWorkers, WorkerDied
from boltrl.context import RolloutContext
from boltrl.errors import BoltrlError, Conflict, NotFound
from boltrl.records import LLM, Attempt, Resources, RolloutStatus
from boltrl.store.base import DEFAULT_LEASE_S, Store

log = logging.getLogger(__name__)

Isolation = Literal["thread", "process"]

DEFAULT_TIMEOUT_S = 1800.0
"""Wall-clock budget of a rollout enqueued without ``timeout_s`` (30 minutes)."""
DEFAULT_POISON_AFTER = 2
"""Worker deaths after which a rollout is failed as poison instead of retried."""


@dataclass
class RunnerStats:
    """What a runner did; updated live (read it from any thread)."""

    claimed: int = 0
    succeeded: int = 0
    failed: int = 0
    timed_out: int = 0
    abandoned: int = 0
    """Attempts given up because the store no longer considered them current."""
    started_at: float = field(default_factory=time.time)


def _worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class Runner:
    """Runs an agent over the rollouts of a store with ``concurrency`` parallel slots.

    Thread-safe to ``stop()`` from any thread (or Ctrl-C when ``run()`` is in the main
    thread): it stops claiming and waits for running rollouts to finish (drain).
    """

    def __init__(
        self,
        agent: AgentFn | str,
        store: Store,
        *,
        concurrency: int = 1,
        worker_id: str | None = None,
        lease_s: float = DEFAULT_LEASE_S,
        heartbeat_s: float | None = None,
        claim_wait_s: float = 1.0,
        retryable: Callable[[BaseException], bool] = _default_retryable,
        isolation: Isolation = "thread",
        default_timeout_s: float | None = DEFAULT_TIMEOUT_S,
        poison_after: int = DEFAULT_POISON_AFTER,
        worker_memory_mb: int | None = None,
    ) -> None:
        """``agent`` is the agent function or its ``module:function`` spec (required
        form for ``isolation="process"`` unless the function is importable by its module
        and name). ``default_timeout_s`` None lets rollouts without a timeout run forever.
        ``worker_memory_mb`` caps each worker process's address space (process isolation
        only), so an agent's memory blow-up is its own ``MemoryError`` (a failed rollout)
        rather than the OOM killer's choice of victim.
        """
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1 (got {concurrency})")
        if lease_s <= 0:
            raise ValueError(f"lease_s must be > 0 (got {lease_s})")
        if isolation not in ("thread", "process"):
            raise ValueError(f"isolation must be 'thread' or 'process' (got {isolation!r})")
        if default_timeout_s is not None and not default_timeout_s > 0:
            raise ValueError(f"default_timeout_s must be > 0 or None (got {default_timeout_s})")
        if poison_after < 1:
            raise ValueError(f"poison_after must be >= 1 (got {poison_after})")
        self.isolation: Isolation = isolation
        self.default_timeout_s = default_timeout_s
        self.poison_after = poison_after
        self._slots = (
            SlotWorkers(agent, concurrency, worker_memory_mb) if isolation == "process" else None
        )
        if isinstance(agent, str) and self._slots is None:
            from boltrl.loading import load_object

            agent = load_object(agent, what="agent")
        self.agent: AgentFn = agent  # type: ignore[assignment]  # a spec only when isolated
        self.store = store
        self.concurrency = concurrency
        self.worker_id = worker_id or _worker_id()
        self.lease_s = lease_s
        self.heartbeat_s = heartbeat_s if heartbeat_s is not None else max(lease_s / 3, 0.05)
        self.claim_wait_s = claim_wait_s
        self.retryable = retryable
        self.stats = RunnerStats()
        self._stop = threading.Event()
        self._abort = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        # Worker exit is tracked with a condition, not Thread.join: a Ctrl-C that
        # interrupts Thread.join on CPython 3.11 can leave the thread marked as stopped
        # while it still runs, and then the drain would not wait for it.
        self._alive = 0
        self._exited = threading.Condition(self._lock)
        self._remaining: int | None = None
        self._idle_exit = False
        self._resources: Resources | None = None
        self._resources_at = 0.0

    # -- public control -------------------------------------------------------------

    def start(self, *, max_rollouts: int | None = None, exit_when_idle: bool = False) -> Runner:
        """Start the worker threads and return at once."""
        self._stop.clear()
        self._remaining = max_rollouts
        self._idle_exit = exit_when_idle
        self._alive = self.concurrency
        self._threads = [
            threading.Thread(
                target=self._worker_loop, args=(slot,), name=f"boltrl-runner-{slot}", daemon=True
            )
            for slot in range(self.concurrency)
        ]
        for t in self._threads:
            t.start()
        return self

    def prestart(self) -> Runner:
        """With ``isolation="process"``, start the worker processes now, so that an agent
        that cannot be imported fails here (``AgentLoadError``) rather than on the first
        rollout; a no-op with threads."""
        if self._slots is not None:
            self._slots.prestart()
        return self

    def stop(self, *, drain: bool = True, timeout_s: float | None = None) -> None:
        """Stop claiming; with ``drain`` wait for running rollouts to finish."""
        self._stop.set()
        if drain:
            self.join(timeout_s)

    def join(self, timeout_s: float | None = None) -> bool:
        """Wait for all worker threads to exit; False if ``timeout_s`` passed first."""
        with self._exited:
            return self._exited.wait_for(lambda: self._alive == 0, timeout_s)

    def run(self, *, max_rollouts: int | None = None, exit_when_idle: bool = False) -> RunnerStats:
        """Run in the calling thread until stopped, ``max_rollouts`` are done, or (with
        ``exit_when_idle``) no rollout could be claimed for ``claim_wait_s``.

        Ctrl-C stops claiming and drains; a second Ctrl-C abandons running rollouts
        (their attempts fail as retryable, so they are requeued at once).
        """
        self.start(max_rollouts=max_rollouts, exit_when_idle=exit_when_idle)
        try:
            while not self.join(0.2):
                pass
        except KeyboardInterrupt:
            log.warning(
                "boltrl runner: stopping, draining %d slot(s) (Ctrl-C again to abort)",
                self.concurrency,
            )
            self._stop.set()
            try:
                self.join()
            except KeyboardInterrupt:
                self._abort.set()
                self.join(5.0)
        return self.stats

    # -- internals ------------------------------------------------------------------

    def _take_slot(self) -> bool:
        with self._lock:
            if self._remaining is None:
                return True
            if self._remaining <= 0:
                return False
            self._remaining -= 1
            return True

    def _give_back_slot(self) -> None:
        with self._lock:
            if self._remaining is not None:
                self._remaining += 1

    def _llm_for(self, attempt: Attempt) -> LLM:
        now = time.monotonic()
        if self._resources is None or now - self._resources_at > 1.0:
            self._resources = self.store.resources()
            self._resources_at = now
        res = self._resources
        if res.gateway_url is None:
            # No model published (e.g. agents that need none): an LLM without endpoint.
            rid = attempt.rollout_id
            return LLM(base_url="", model=res.model, api_key=res.api_key, rollout_id=rid)
        return res.llm_for(attempt.rollout_id, attempt)

    def _worker_loop(self, slot: int) -> None:
        try:
            self._claim_loop(slot)
        finally:
            if self._slots is not None:
                self._slots.stop(slot)
            with self._exited:
                self._alive -= 1
                self._exited.notify_all()

    def _claim_loop(self, slot: int) -> None:
        while not self._stop.is_set():
            if not self._take_slot():
                return
            try:
                attempt = self.store.claim(
                    self.worker_id, lease_s=self.lease_s, wait_s=self.claim_wait_s
                )
            except BoltrlError:
                log.exception("boltrl runner: claim failed; retrying")
                self._give_back_slot()
                self._stop.wait(1.0)
                continue
            if attempt is None:
                self._give_back_slot()
                if self._idle_exit:
                    return
                continue
            with self._lock:
                self.stats.claimed += 1
            try:
                self._execute(attempt, slot)
            except Exception:
                log.exception("boltrl runner: internal error on rollout %s", attempt.rollout_id)

    def _execute(self, attempt: Attempt, slot: int) -> None:
        assert attempt.task is not None, "store.claim must fill in the task"
        ctx = RolloutContext(attempt, self.store.record)
        try:
            llm = self._llm_for(attempt)
            run: _AgentRun | ProcessRun
            if self._slots is not None:
                run = self._slots.run(slot, attempt, dict(attempt.task.input), llm, ctx)
            else:
                run = _AgentRun(self.agent, dict(attempt.task.input), llm, ctx)
        except AgentLoadError as e:
            log.error("boltrl runner: stopping: %s", e)
            self._stop.set()  # every later rollout would fail the same way
            self._finish(
                attempt, RolloutStatus.FAILED, error=str(e), kind="agent_load", retryable=True
            )
            return
        except BoltrlError as e:
            self._finish(
                attempt, RolloutStatus.FAILED, error=str(e), kind="resources", retryable=True
            )
            return
        run.start()
        current = self._supervise(run, ctx, attempt)
        if current is not None:
            ctx.flush()
            self._report(run, current)

    def _supervise(
        self, run: _AgentRun | ProcessRun, ctx: RolloutContext, attempt: Attempt
    ) -> Attempt | None:
        """Heartbeat until the agent returns; returns the (renewed) attempt then, or None
        when the attempt was ended here (abort, timeout) or taken away (abandoned)."""
        timeout_s = attempt.timeout_s if attempt.timeout_s is not None else self.default_timeout_s
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            wait = self.heartbeat_s
            if deadline is not None:
                wait = min(wait, max(0.0, deadline - time.monotonic()))
            if run.done.wait(wait):
                return attempt
            if self._abort.is_set() or (deadline is not None and time.monotonic() >= deadline):
                run.cancel()
                ctx.close()
                aborted = self._abort.is_set()
                if not aborted:
                    with self._lock:
                        self.stats.timed_out += 1
                error = (
                    "runner aborted"
                    if aborted
                    else f"agent did not finish within timeout_s={timeout_s}"
                )
                kind = "aborted" if aborted else "timeout"
                self._finish(attempt, RolloutStatus.FAILED, error=error, kind=kind, retryable=True)
                return None
            try:
                attempt = self.store.heartbeat(attempt, lease_s=self.lease_s)
                ctx.attempt = attempt
            except (Conflict, NotFound) as e:
                log.warning("boltrl runner: abandoning rollout %s: %s", attempt.rollout_id, e)
                run.cancel()
                ctx.close(flush=False)
                with self._lock:
                    self.stats.abandoned += 1
                return None
            except BoltrlError:
                log.exception("boltrl runner: heartbeat failed for %s", attempt.rollout_id)
            ctx.flush()

    def _report(self, run: _AgentRun | ProcessRun, attempt: Attempt) -> None:
        """Finish the attempt with what the agent returned or raised."""
        if isinstance(run.error, WorkerDied):
            self._report_death(run.error, attempt)
            return
        if isinstance(run, ProcessRun) and run.bad_return is not None:
            self._finish(attempt, RolloutStatus.FAILED, error=run.bad_return, kind="bad_return")
            return
        if run.error is not None:
            self._finish(
                attempt,
                RolloutStatus.FAILED,
                error=run.error_text,
                kind="exception",
                retryable=self.retryable(run.error),
            )
            return
        try:
            reward = _as_reward(run.result)
        except (TypeError, ValueError) as e:
            self._finish(attempt, RolloutStatus.FAILED, error=str(e), kind="bad_return")
            return
        self._finish(attempt, RolloutStatus.SUCCEEDED, reward=reward)

    def _report_death(self, died: WorkerDied, attempt: Attempt) -> None:
        """A worker death is retried, until the rollout has killed ``poison_after``
        workers (on any runner: the store's attempts say how many it killed before)."""
        try:
            before = self.store.get(attempt.rollout_id).attempts
        except BoltrlError:
            before = []
        deaths = 1 + sum(a.error_kind in ("worker_died", "poison") for a in before)
        if deaths >= self.poison_after:
            error = (
                f"poison: rollout {attempt.rollout_id} killed the agent's worker process "
                f"{deaths} time(s), last: {died}; not retried"
            )
            self._finish(attempt, RolloutStatus.FAILED, error=error, kind="poison")
        else:
            self._finish(
                attempt, RolloutStatus.FAILED, error=str(died), kind="worker_died", retryable=True
            )

    def _finish(
        self,
        attempt: Attempt,
        status: RolloutStatus,
        *,
        reward: float | None = None,
        error: str | None = None,
        kind: str | None = None,
        retryable: bool = False,
    ) -> None:
        try:
            self.store.finish(
                attempt, status, reward=reward, error=error, error_kind=kind, retryable=retryable
            )
        except (Conflict, NotFound) as e:
            log.warning("boltrl runner: could not finish rollout %s: %s", attempt.rollout_id, e)
            with self._lock:
                self.stats.abandoned += 1
            return
        with self._lock:
            if status is RolloutStatus.SUCCEEDED:
                self.stats.succeeded += 1
            else:
                self.stats.failed += 1


def copy_context_thread(target: Callable[..., Any], *args: Any) -> threading.Thread:
    """A thread that runs ``target`` in a copy of the caller's context, so records made
    inside it reach the caller's rollout even when several rollouts run at once."""
    ctx = contextvars.copy_context()
    return threading.Thread(target=ctx.run, args=(target, *args), daemon=True)
