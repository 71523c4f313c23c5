"""The AutoGen event-log handler and the global hook that installs it.

AutoGen logs model calls and tool runs as objects on two ``logging`` loggers:
autogen-core's ``EVENT_LOGGER_NAME`` (``LLMCallEvent``; ``LLMStreamStartEvent`` +
``LLMStreamEndEvent`` for streamed calls; ``ToolCallEvent`` when a tool returns, at INFO)
and AgentChat's (``ToolCallRequestEvent`` / ``ToolCallExecutionEvent`` with the agent's
name, the tool-call ids and errors, at DEBUG). Events carry no run ids, but the logging
call is synchronous, in the emitting coroutine's context: the handler finds the rollout
with ``boltrl.context.current()``.

Per rollout it keeps what pairs events: the open stream of each agent (start → end),
AgentChat's pending tool requests, and which model call asked for each tool-call id.

Every handler body is wrapped: a failure is logged and counted (``stats()``), never
raised. Every field is extracted on its own, so an odd field is left empty and the rest
kept.
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import sys
import threading
import uuid
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from autogen_agentchat.messages import ToolCallExecutionEvent, ToolCallRequestEvent
from autogen_core.logging import LLMCallEvent, LLMStreamEndEvent, LLMStreamStartEvent, ToolCallEvent

from boltrl._common import JSON
from boltrl.adapter_support import Counters, Installation, json_or_str, new_id
from boltrl.context import RolloutContext, current
from boltrl.records import CallAnnotation, ToolStep
from boltrl_autogen import _convert as cv

log = logging.getLogger(__name__)

FRAMEWORK = "autogen"


_counters = Counters("boltrl_autogen", log, "calls", "tool_steps")
_field = _counters.field


stats = _counters.snapshot
"""Counters since import: ``calls`` and ``tool_steps`` recorded, ``failures`` (a hook
that could not record; logged) and ``field_failures`` (one field left empty)."""


@dataclass(slots=True)
class _Stream:
    messages: list[JSON] | None
    agent: str | None
    agent_id: str | None


@dataclass(slots=True)
class _Request:
    name: str
    arguments: Any
    agent: str | None


@dataclass(slots=True)
class _State:
    """What one rollout's events need from earlier events."""

    streams: dict[str | None, _Stream] = field(default_factory=dict)
    """Open streamed calls by agent id."""
    requests: dict[str, _Request] = field(default_factory=dict)
    """AgentChat tool requests by tool-call id, until their execution event."""
    done: set[str] = field(default_factory=set)
    """Tool-call ids already recorded from a ``ToolCallEvent``."""
    asked_by: dict[str, tuple[str | None, str]] = field(default_factory=dict)
    """Tool-call id → (response id if known, annotation span id) of the call that asked."""


_SPAN_PREFIX = f"autogen-{uuid.uuid4().hex[:16]}-"
_span_numbers = itertools.count()
"""AutoGen has no span ids: each annotation gets a process-unique one, so tool steps can
name the streamed call that asked for them before its response id is known."""

_STACK_DEPTH = 60
_AGENT_FRAMES = frozenset({"_call_llm", "_reflect_on_tool_use_flow"})


def _agent_from_stack() -> str | None:
    """Outside a runtime (an agent run on its own) events carry no agent id; AgentChat's
    AssistantAgent calls its model from ``_call_llm(..., agent_name, ...)``, and with
    ``reflect_on_tool_use=True`` once more from ``_reflect_on_tool_use_flow(...,
    agent_name, ...)``; the frame is on the stack while the event is logged. (Its tools
    run in tasks of their own: a tool event's stack does not reach the agent.)"""
    frame: FrameType | None = sys._getframe(1)
    for _ in range(_STACK_DEPTH):
        if frame is None:
            return None
        if frame.f_code.co_name in _AGENT_FRAMES:
            name = frame.f_locals.get("agent_name")
            return name if isinstance(name, str) else None
        frame = frame.f_back
    return None


class BoltrlEventHandler(logging.Handler):
    """Records, inside a boltrl rollout, every model call and tool run AutoGen logs.

    Attach it with ``boltrl_autogen.instrument()``, or yourself to autogen-core's
    ``EVENT_LOGGER_NAME`` logger (level INFO) and, for tool-call ids and tool errors,
    AgentChat's ``EVENT_LOGGER_NAME`` logger (level DEBUG). Outside a rollout it returns
    at once. Thread-safe; never raises.
    """

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self._states: weakref.WeakKeyDictionary[RolloutContext, _State] = (
            weakref.WeakKeyDictionary()
        )
        self._states_lock = threading.Lock()
        self._dispatch: dict[type, Callable[[Any, RolloutContext, float], None]] = {
            LLMCallEvent: self._llm_call,
            LLMStreamStartEvent: self._stream_start,
            LLMStreamEndEvent: self._stream_end,
            ToolCallEvent: self._tool_call,
            ToolCallRequestEvent: self._tool_request,
            ToolCallExecutionEvent: self._tool_execution,
        }

    def handle(self, record: logging.LogRecord) -> bool:
        # Without logging.Handler's lock: emit is thread-safe and must not serialize
        # every agent of the process on one lock.
        if self.filters and not self.filter(record):
            return False
        self.emit(record)
        return True

    @_counters.guard(lambda _self, record: f"recording a {type(record.msg).__name__}")
    def emit(self, record: logging.LogRecord) -> None:
        ctx = current()
        if ctx is None:
            return
        fn = self._dispatch.get(type(record.msg))
        if fn is None:
            return
        fn(record.msg, ctx, record.created)

    def _state(self, ctx: RolloutContext) -> _State:
        st = self._states.get(ctx)
        if st is None:
            with self._states_lock:
                st = self._states.setdefault(ctx, _State())
        return st

    # -- model calls ----------------------------------------------------------------

    def _annotate(
        self,
        ctx: RolloutContext,
        *,
        call_id: str | None,
        agent: str | None,
        agent_id: str | None,
        messages: list[JSON] | None,
        message: JSON | None,
    ) -> None:
        span_id = f"{_SPAN_PREFIX}{next(_span_numbers)}"
        ctx.add(
            CallAnnotation(
                id=new_id("ann"),
                call_id=call_id,
                span_id=span_id,
                parent_id=agent_id,
                agent=agent,
                framework=FRAMEWORK,
                request_messages=messages,
                response=None if message is None else {"message": message},
            )
        )
        _counters.count("calls")
        st = self._state(ctx)
        for tc_id in _field(cv.tool_call_ids, message) or ():
            st.asked_by[tc_id] = (call_id, span_id)

    def _agent(self, agent_id: str | None) -> str | None:
        return _field(cv.agent_name, agent_id) if agent_id else _field(_agent_from_stack)

    def _llm_call(self, event: LLMCallEvent, ctx: RolloutContext, at: float) -> None:
        kw = event.kwargs
        agent_id = kw.get("agent_id")
        response = kw.get("response")
        self._annotate(
            ctx,
            call_id=_field(cv.completion_id, response),
            agent=self._agent(agent_id),
            agent_id=agent_id,
            messages=_field(cv.request_messages, kw.get("messages")),
            message=_field(cv.completion_message, response),
        )

    def _stream_start(self, event: LLMStreamStartEvent, ctx: RolloutContext, at: float) -> None:
        kw = event.kwargs
        agent_id = kw.get("agent_id")
        st = self._state(ctx)
        stale = st.streams.pop(agent_id, None)
        if stale is not None:  # that stream never ended: annotate it without a response
            self._annotate(
                ctx,
                call_id=None,
                agent=stale.agent,
                agent_id=stale.agent_id,
                messages=stale.messages,
                message=None,
            )
        st.streams[agent_id] = _Stream(
            _field(cv.request_messages, kw.get("messages")), self._agent(agent_id), agent_id
        )

    def _stream_end(self, event: LLMStreamEndEvent, ctx: RolloutContext, at: float) -> None:
        kw = event.kwargs
        agent_id = kw.get("agent_id")
        start = self._state(ctx).streams.pop(agent_id, None)
        if start is None:
            start = _Stream(None, self._agent(agent_id), agent_id)
        self._annotate(
            ctx,
            call_id=None,  # a stream's chunks carry the id, but AutoGen does not pass it on
            agent=start.agent,
            agent_id=agent_id,
            messages=start.messages,
            message=_field(cv.create_result_message, kw.get("response")),
        )

    # -- tools ----------------------------------------------------------------------

    def _step(
        self,
        ctx: RolloutContext,
        name: str,
        *,
        tool_call_id: str | None,
        arguments: Any,
        result: Any = None,
        error: str | None = None,
        agent: str | None,
        at: float,
        fallback_parent: str | None = None,
    ) -> None:
        asked = self._state(ctx).asked_by.get(tool_call_id) if tool_call_id else None
        call_id, span_id = asked if asked else (None, None)
        ctx.add(
            ToolStep(
                id=new_id("tool"),
                name=name,
                arguments=arguments,
                result=result,
                error=error,
                parent_id=call_id or span_id or fallback_parent,
                call_id=call_id,
                tool_call_id=tool_call_id,
                agent=agent,
                # AutoGen logs a tool run once, when it is over: its start is unknown
                started_at=at,
                ended_at=at,
            )
        )
        _counters.count("tool_steps")

    def _tool_request(self, event: ToolCallRequestEvent, ctx: RolloutContext, at: float) -> None:
        st = self._state(ctx)
        for fc in event.content:
            st.requests[fc.id] = _Request(
                fc.name, _field(cv.parse_arguments, fc.arguments), event.source
            )

    def _tool_call(self, event: ToolCallEvent, ctx: RolloutContext, at: float) -> None:
        """A tool returned. Paired with AgentChat's pending request of the same name and
        arguments when there is one (for its id and agent), else recorded on its own."""
        kw = event.kwargs
        name = kw.get("tool_name")
        arguments = _field(json_or_str, kw.get("arguments"))
        st = self._state(ctx)
        tc_id = next(
            (
                i
                for i, r in st.requests.items()
                if i not in st.done and r.name == name and _same(r.arguments, arguments)
            ),
            None,
        )
        request = st.requests.get(tc_id) if tc_id else None
        if tc_id is not None:
            st.done.add(tc_id)
        agent_id = kw.get("agent_id")
        self._step(
            ctx,
            str(name),
            tool_call_id=tc_id,
            arguments=arguments,
            result=_field(json_or_str, kw.get("result")),
            agent=request.agent if request else self._agent(agent_id),
            at=at,
            fallback_parent=agent_id,
        )

    def _tool_execution(
        self, event: ToolCallExecutionEvent, ctx: RolloutContext, at: float
    ) -> None:
        """AgentChat's results: those no ``ToolCallEvent`` recorded (errors, handoffs,
        tools that are not autogen-core ``BaseTool``s) are recorded here."""
        st = self._state(ctx)
        for res in event.content:
            request = st.requests.pop(res.call_id, None)
            if res.call_id in st.done:
                st.done.discard(res.call_id)
                continue
            self._step(
                ctx,
                res.name,
                tool_call_id=res.call_id,
                arguments=request.arguments if request else None,
                result=None if res.is_error else res.content,
                error=res.content if res.is_error else None,
                agent=event.source,
                at=at,
            )


def _same(a: Any, b: Any) -> bool:
    if a == b:
        return True
    try:
        return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    except (TypeError, ValueError):
        return False


# -- global install ------------------------------------------------------------------

CORE_LOGGER = "autogen_core.events"
"""autogen-core's ``EVENT_LOGGER_NAME``: model calls and tool returns, at INFO."""
AGENTCHAT_LOGGER = "autogen_agentchat.events"
"""AgentChat's ``EVENT_LOGGER_NAME``: tool requests and results (ids, errors), at DEBUG."""
_LEVELS = {CORE_LOGGER: logging.INFO, AGENTCHAT_LOGGER: logging.DEBUG}


_installation: Installation[BoltrlEventHandler] = Installation()


def instrument() -> BoltrlEventHandler:
    """Attach one ``BoltrlEventHandler`` to AutoGen's two event loggers (idempotent) and
    return it.

    A logger that was not already enabled at the level the events use is enabled, with
    ``propagate`` turned off so that enabling it for boltrl does not send AutoGen's event
    stream to your own (root) handlers. ``uninstrument()`` restores level, propagation and
    handlers exactly."""
    return _installation.instrument(_attach)


def _attach() -> tuple[BoltrlEventHandler, Callable[[], None]]:
    handler = BoltrlEventHandler()
    undo: list[Callable[[], None]] = []
    for name, level in _LEVELS.items():
        logger = logging.getLogger(name)
        undo.append(functools.partial(_restore, logger, logger.level, logger.propagate))
        if not any(isinstance(h, BoltrlEventHandler) for h in logger.handlers):
            logger.addHandler(handler)
            undo.append(functools.partial(logger.removeHandler, handler))
        if logger.getEffectiveLevel() > level:
            logger.setLevel(level)
            logger.propagate = False

    def detach() -> None:
        for step in undo:
            step()

    return handler, detach


def _restore(logger: logging.Logger, level: int, propagate: bool) -> None:
    logger.setLevel(level)
    logger.propagate = propagate


def uninstrument() -> None:
    """Detach the handler ``instrument()`` attached and restore both loggers' level and
    propagation (idempotent)."""
    _installation.uninstrument()


def installed() -> BoltrlEventHandler | None:
    """The handler ``instrument()`` attached, while it is attached."""
    return _installation.installed()
