"""The rollout running in the current context, and the calls that attach records to it.

The runner enters a ``RolloutContext`` around the agent. Code anywhere below it —
the agent, its framework, an adapter's callback — reaches the rollout through
``current()``; ``emit_reward`` and friends use it. The context lives in a
``contextvars.ContextVar``, so asyncio tasks the agent spawns inherit it, as do threads
started through ``asyncio.to_thread``, ``contextvars.copy_context().run`` or
``boltrl.runner.copy_context_thread``. For plain threads (``threading.Thread``,
executors) that do not copy the context, a narrow fallback applies: when exactly one
rollout is active in the process *and the calling thread was started during it*, that
rollout is used. A thread left running by an earlier rollout (or a pool thread that
existed before the rollout began) never reaches a later rollout; hand such threads the
context explicitly (``contextvars.copy_context().run``).

A context is closed when the agent returns (leaving the ``with`` block): records that
arrive afterwards, from any thread, are dropped and counted (``dropped_records``), and
the store refuses anything of an attempt that ended.

Outside any rollout the helpers warn once and do nothing.
"""

from __future__ import annotations

import contextvars
import itertools
import logging
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from boltrl.records import AnyRecord, Attempt, CallAnnotation, RewardEvent, ToolStep

log = logging.getLogger(__name__)

RecordSink = Callable[[Attempt, Sequence[AnyRecord]], None]
"""Where a context sends records: usually ``store.record``."""


class RolloutContext:
    """Collects the records of one running attempt and sends them to its sink.

    Rewards are written through at once (their position among the gateway's calls
    matters for credit assignment); annotations and tool steps are buffered and sent by
    ``flush()``, which the runner calls periodically and when the agent returns.
    Thread-safe.
    """

    def __init__(self, attempt: Attempt, sink: RecordSink) -> None:
        self.attempt = attempt
        self._sink = sink
        self._lock = threading.Lock()
        self._buffer: list[AnyRecord] = []
        self._index = itertools.count()
        self.failed_records = 0
        """Records the sink refused or failed to take (logged, never raised into the agent)."""
        self.dropped_records = 0
        """Records that arrived after the attempt was closed (e.g. an abandoned agent)."""
        self._closed = False
        self._token: contextvars.Token[RolloutContext | None] | None = None
        self._threads_before: frozenset[threading.Thread] = frozenset()
        """Threads alive when the context was entered: never the fallback's callers."""

    @property
    def rollout_id(self) -> str:
        return self.attempt.rollout_id

    def _stamp(self, record: AnyRecord) -> AnyRecord:
        return record.model_copy(
            update={
                "rollout_id": self.attempt.rollout_id,
                "attempt": self.attempt.number,
                "index": next(self._index),
            }
        )

    def add(self, record: AnyRecord, *, write_through: bool = False) -> AnyRecord:
        """Attach a record to this attempt; returns it as stamped (ids, index)."""
        stamped = self._stamp(record)
        if self._closed:
            self.dropped_records += 1
            return stamped
        if write_through:
            self.flush(extra=[stamped])
        else:
            with self._lock:
                self._buffer.append(stamped)
        return stamped

    def flush(self, extra: Sequence[AnyRecord] = ()) -> None:
        """Send buffered records (and ``extra``) to the sink. Never raises."""
        with self._lock:
            batch = [*self._buffer, *extra]
            self._buffer.clear()
            if not batch:
                return
            try:
                self._sink(self.attempt, batch)
            except Exception:
                self.failed_records += len(batch)
                log.exception(
                    "boltrl: could not record %d record(s) for rollout %s",
                    len(batch),
                    self.attempt.rollout_id,
                )

    def send(self, records: Sequence[AnyRecord]) -> None:
        """Write records already stamped elsewhere (by the attempt's context in a worker
        process) straight to the sink. Raises ``RuntimeError`` once this context is
        closed, and whatever the sink raises."""
        if self._closed:
            raise RuntimeError(f"rollout {self.rollout_id}: the attempt has ended")
        self._sink(self.attempt, records)

    def close(self, *, flush: bool = True) -> None:
        """Stop accepting records (after a timeout or abandonment); later ones are dropped
        and counted in ``dropped_records``."""
        if flush:
            self.flush()
        self._closed = True
        with _ACTIVE_LOCK:  # an abandoned agent's context is no fallback for anyone
            _ACTIVE.pop(id(self), None)

    # -- entering / leaving -------------------------------------------------------------

    def __enter__(self) -> RolloutContext:
        # The entering thread itself reaches the context through the context variable.
        self._threads_before = frozenset(threading.enumerate())
        self._token = _CURRENT.set(self)
        with _ACTIVE_LOCK:
            _ACTIVE[id(self)] = self
        return self

    def __exit__(self, *exc: object) -> None:
        with _ACTIVE_LOCK:
            _ACTIVE.pop(id(self), None)
        if self._token is not None:
            try:
                _CURRENT.reset(self._token)
            except ValueError:  # exited from another context (e.g. a different task)
                _CURRENT.set(None)
            self._token = None
        self.close()


_CURRENT: contextvars.ContextVar[RolloutContext | None] = contextvars.ContextVar(
    "boltrl_rollout", default=None
)
_ACTIVE: dict[int, RolloutContext] = {}
_ACTIVE_LOCK = threading.Lock()
_warned: set[str] = set()


def current() -> RolloutContext | None:
    """The rollout context of the caller, or None outside any rollout.

    Cheap (a context-variable read) so adapters can call it on every event.
    """
    ctx = _CURRENT.get()
    if ctx is not None:
        return ctx
    if len(_ACTIVE) == 1:  # maybe a plain thread spawned by the only running agent
        with _ACTIVE_LOCK:
            only = next(iter(_ACTIVE.values())) if len(_ACTIVE) == 1 else None
        if only is not None and threading.current_thread() not in only._threads_before:
            return only
    return None


def _warn_outside(what: str) -> None:
    if what in _warned:
        return
    _warned.add(what)
    warnings.warn(
        f"boltrl.{what}() called outside a rollout; ignored (this warning is shown once)",
        RuntimeWarning,
        stacklevel=3,
    )


def emit_reward(
    value: float, name: str = "reward", *, call_id: str | None = None
) -> RewardEvent | None:
    """Record an intermediate reward for the current rollout.

    ``call_id`` ties it to one model call; otherwise it counts from its position among
    the rollout's calls (the store orders records as written). Returns the event, or
    None outside a rollout. Raises ``ValueError`` for a non-finite value.
    """
    ev = RewardEvent(value=value, name=name, call_id=call_id, timestamp=time.time())
    ctx = current()
    if ctx is None:
        _warn_outside("emit_reward")
        return None
    out = ctx.add(ev, write_through=True)
    assert isinstance(out, RewardEvent)
    return out


def record_tool_step(
    name: str,
    arguments: Any = None,
    *,
    result: Any = None,
    error: str | None = None,
    parent_id: str | None = None,
    call_id: str | None = None,
    tool_call_id: str | None = None,
    agent: str | None = None,
    started_at: float | None = None,
    ended_at: float | None = None,
    id: str | None = None,
) -> ToolStep | None:
    """Record one tool execution for the current rollout (None outside a rollout)."""
    ctx = current()
    if ctx is None:
        _warn_outside("record_tool_step")
        return None
    now = time.time()
    fields: dict[str, Any] = {
        "name": name,
        "arguments": arguments,
        "result": result,
        "error": error,
        "parent_id": parent_id,
        "call_id": call_id,
        "tool_call_id": tool_call_id,
        "agent": agent,
        "started_at": started_at if started_at is not None else now,
        "ended_at": ended_at if ended_at is not None else now,
    }
    if id is not None:
        fields["id"] = id
    out = ctx.add(ToolStep(**fields))
    assert isinstance(out, ToolStep)
    return out


def annotate_call(annotation: CallAnnotation) -> CallAnnotation | None:
    """Record what an adapter knows about a model call (agent, parent, messages).

    Silent outside a rollout: adapters call it on every event and must stay cheap.
    """
    ctx = current()
    if ctx is None:
        return None
    out = ctx.add(annotation)
    assert isinstance(out, CallAnnotation)
    return out
