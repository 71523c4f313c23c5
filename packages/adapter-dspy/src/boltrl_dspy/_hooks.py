"""The DSPy callback and the global install.

DSPy calls a callback around every module ``forward``, LM call and tool call, each with
its own call id; while one runs, ``dspy.utils.callback.ACTIVE_CALL_ID`` holds its id,
which is how a child finds its parent. The callback keeps a frame per running module
(its predictor path, e.g. ``react`` or ``extract.predict``) so an LM call is named after
the predictor that made it, and a tool call is tied to the last LM call of the module
that ran it (ReAct: the ``react`` step that chose the tool).

The callback's ``outputs`` are the LM's text only; the response id and whether DSPy
answered from its cache are read from the LM's history entry of the call, which DSPy
writes before the call returns.

Every hook body is wrapped: a failure is logged and counted (``stats()``), never raised.
Every field is extracted on its own, so an odd field is left empty and the rest kept.
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dspy.utils.callback import ACTIVE_CALL_ID, BaseCallback

from boltrl.adapter_support import Counters, Installation
from boltrl.context import RolloutContext, current
from boltrl.records import CallAnnotation, ToolStep
from boltrl_dspy import _convert as cv

log = logging.getLogger(__name__)

FRAMEWORK = "dspy"
_MAX_OPEN = 10_000
"""Open module / LM / tool calls kept per callback; beyond it the oldest go."""

_counters = Counters("boltrl_dspy", log, "calls", "cached_calls", "tool_steps")
_field = _counters.field


stats = _counters.snapshot
"""Counters since import: ``calls`` recorded (``cached_calls``: DSPy cache hits,
recorded apart), ``tool_steps``, ``failures`` (a hook that could not record; logged)
and ``field_failures`` (one field left empty)."""


@dataclass(slots=True, frozen=True)
class _Caller:
    """An LM call, as a later tool call refers to it."""

    span_id: str
    call_id: str | None
    agent: str | None


@dataclass(slots=True)
class _Frame:
    """A running module."""

    path: str
    parent: _Frame | None
    module: Any
    root: _Frame | None = None
    """The outermost running module of this call tree (None: this is it)."""
    names: dict[int, str] | None = None
    """The root's ``id(module) → path`` map, built on first need (a bare predictor
    making its own LM calls never needs it)."""
    last_call: _Caller | None = None

    def child_path(self, module: Any) -> str:
        root = self.root or self
        if root.names is None:
            root.names = _field(cv.module_paths, root.module) or {}
        return root.names.get(id(module)) or type(module).__name__


@dataclass(slots=True)
class _OpenCall:
    ctx: RolloutContext
    lm: Any
    inputs: dict[str, Any]
    parent_id: str | None
    frame: _Frame | None
    agent: str | None


@dataclass(slots=True)
class _OpenTool:
    ctx: RolloutContext
    name: str
    arguments: Any
    parent_id: str | None
    frame: _Frame | None
    started_at: float


@dataclass
class _Open:
    frames: dict[str, _Frame] = field(default_factory=dict)
    calls: dict[str, _OpenCall] = field(default_factory=dict)
    tools: dict[str, _OpenTool] = field(default_factory=dict)


class BoltrlCallback(BaseCallback):  # type: ignore[misc]  # dspy ships no type hints
    """Records every LM call and tool call of a DSPy program inside a boltrl rollout.

    Install it with ``dspy.configure(callbacks=[BoltrlCallback()])`` (or
    ``dspy.context(callbacks=[...])``, or ``boltrl_dspy.instrument()``). Outside a
    rollout it does nothing. One instance may serve many rollouts and threads at once.
    Never raises.
    """

    def __init__(self) -> None:
        self._open = _Open()
        self._claimed: deque[str] = deque(maxlen=256)
        self._lock = threading.Lock()

    # -- modules -------------------------------------------------------------------------

    @_counters.guard()
    def on_module_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        if current() is None:
            return
        frames = self._open.frames
        parent = frames.get(ACTIVE_CALL_ID.get() or "")
        if parent is None:
            frame = _Frame(type(instance).__name__, None, instance)
        else:
            path = parent.child_path(instance)
            frame = _Frame(path, parent, instance, root=parent.root or parent)
        frames[call_id] = frame
        if len(frames) > _MAX_OPEN:
            self._evict(frames)

    @_counters.guard()
    def on_module_end(
        self, call_id: str, outputs: Any | None, exception: Exception | None = None
    ) -> None:
        self._open.frames.pop(call_id, None)

    # -- LM calls ------------------------------------------------------------------------

    @_counters.guard()
    def on_lm_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        ctx = current()
        if ctx is None:
            return
        parent_id = ACTIVE_CALL_ID.get()
        frame = self._open.frames.get(parent_id or "")
        self._open.calls[call_id] = _OpenCall(
            ctx=ctx,
            lm=instance,
            inputs=inputs,
            parent_id=parent_id,
            frame=frame,
            agent=frame.path if frame is not None else None,
        )
        if len(self._open.calls) > _MAX_OPEN:
            self._evict(self._open.calls)

    @_counters.guard()
    def on_lm_end(
        self, call_id: str, outputs: Any | None, exception: Exception | None = None
    ) -> None:
        call = self._open.calls.pop(call_id, None)
        if call is None:
            return
        self._close_call(call_id, call, outputs, exception)

    def _close_call(
        self, span_id: str, call: _OpenCall, outputs: Any, error: BaseException | None
    ) -> None:
        inputs = call.inputs
        if error is None:
            entry = _field(self._history_entry, call)
            response = _field(cv.response_of, outputs, entry)
            cached = bool(_field(cv.is_cache_hit, entry)) if entry is not None else False
            # a cached response still carries the id of the call that filled the cache,
            # a call of another time (or rollout): this one has no gateway record
            rid = None if cached else _field(cv.response_id, entry)
        else:
            rid, cached = None, False
            response = {"error": _field(cv.error_text, error)}
        ann = CallAnnotation(
            id=f"ann-{span_id}",
            call_id=rid,
            span_id=span_id,
            parent_id=call.parent_id,
            agent=call.agent,
            framework=FRAMEWORK,
            request_messages=_field(cv.request_messages, inputs),
            response=response,
            cached=cached,
        )
        call.ctx.add(ann)
        _counters.count("cached_calls" if cached else "calls")
        caller = _Caller(span_id, rid, call.agent)
        frame = call.frame
        while frame is not None:  # the module that runs a tool next asked for it
            frame.last_call = caller
            frame = frame.parent

    def _history_entry(self, call: _OpenCall) -> Mapping[str, Any] | None:
        history = getattr(call.lm, "history", None)
        if not history:
            import dspy.clients.base_lm as base_lm

            history = base_lm.GLOBAL_HISTORY
        inputs = call.inputs
        with self._lock:
            entry = cv.find_history_entry(
                history, inputs.get("messages"), inputs.get("prompt"), self._claimed
            )
            if entry is not None and isinstance(entry.get("uuid"), str):
                self._claimed.append(entry["uuid"])
        return entry

    # -- tools ---------------------------------------------------------------------------

    @_counters.guard()
    def on_tool_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
        ctx = current()
        if ctx is None:
            return
        parent_id = ACTIVE_CALL_ID.get()
        name = getattr(instance, "name", None)
        self._open.tools[call_id] = _OpenTool(
            ctx=ctx,
            name=name if isinstance(name, str) else type(instance).__name__,
            arguments=_field(cv.tool_arguments, inputs),
            parent_id=parent_id,
            frame=self._open.frames.get(parent_id or ""),
            started_at=time.time(),
        )
        if len(self._open.tools) > _MAX_OPEN:
            self._evict(self._open.tools)

    @_counters.guard()
    def on_tool_end(
        self, call_id: str, outputs: Any | None, exception: BaseException | None = None
    ) -> None:
        tool = self._open.tools.pop(call_id, None)
        if tool is None:
            return
        frame = tool.frame
        who = frame.last_call if frame is not None else None
        step = ToolStep(
            id=f"tool-{call_id}",
            name=tool.name,
            arguments=tool.arguments,
            result=None if exception is not None else _field(cv.jsonable, outputs),
            error=None if exception is None else _field(cv.error_text, exception),
            # The LM call that chose the tool: its response id when known, else its
            # span (the join maps spans to call ids); else the module running it.
            parent_id=(who.call_id or who.span_id) if who is not None else tool.parent_id,
            call_id=who.call_id if who is not None else None,
            agent=who.agent if who is not None else (frame.path if frame else None),
            started_at=tool.started_at,
            ended_at=time.time(),
        )
        tool.ctx.add(step)
        _counters.count("tool_steps")

    def _evict(self, runs: dict[str, Any]) -> None:
        with self._lock:
            while len(runs) > _MAX_OPEN:
                try:
                    runs.pop(next(iter(runs)))
                except (StopIteration, KeyError, RuntimeError):
                    break
        log.warning("boltrl_dspy: over %d open calls; dropped the oldest", _MAX_OPEN)


# -- global install ----------------------------------------------------------------------


def _settings_module() -> Any:
    # ``dspy.dsp.utils.settings`` the attribute is the Settings object; the module holds
    # the global config dict and its lock
    return importlib.import_module("dspy.dsp.utils.settings")


_installation: Installation[BoltrlCallback] = Installation()


def instrument(callback: BoltrlCallback | None = None) -> BoltrlCallback:
    """Add a ``BoltrlCallback`` to DSPy's global callbacks. Idempotent: a second call
    returns the installed callback.

    It writes the global settings directly rather than through ``dspy.configure``, which
    would make the calling thread the only one allowed to configure DSPy afterwards. A
    ``dspy.context(callbacks=[...])`` block replaces the global callbacks: include the
    callback there yourself (``boltrl_dspy.installed()``).
    """
    return _installation.instrument(
        lambda: _attach(callback if callback is not None else BoltrlCallback())
    )


def _attach(cb: BoltrlCallback) -> tuple[BoltrlCallback, Callable[[], None]]:
    dspy_settings = _settings_module()
    with dspy_settings.global_lock:
        config = dspy_settings.main_thread_config
        before = config.get("callbacks")
        now = [*(before or ()), cb]
        config["callbacks"] = now

    def detach() -> None:
        with dspy_settings.global_lock:
            current_list = config.get("callbacks")
            if current_list is now:
                config["callbacks"] = before
            elif isinstance(current_list, list):  # reconfigured meanwhile: only take ours out
                config["callbacks"] = [c for c in current_list if c is not cb]

    return cb, detach


def uninstrument() -> None:
    """Remove what ``instrument()`` added, leaving DSPy's settings as they were (the very
    same callbacks list, when nothing else changed it meanwhile). Idempotent."""
    _installation.uninstrument()


def installed() -> BoltrlCallback | None:
    """The callback ``instrument()`` installed, or None."""
    return _installation.installed()
