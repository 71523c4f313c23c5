"""The Agents SDK trace processor and the global hook that installs it.

The SDK opens a trace per ``Runner.run`` and, inside it, spans that nest as
task → agent → turn → {generation | response, function, handoff} (0.24; older versions
put the model and tool spans right under the agent span). Trace processors are
process-global and called synchronously wherever a span starts or ends, so the
processor decides which rollout a span belongs to when it starts — from its parent
span, else its trace, else the caller's rollout context — and remembers that per span
id until the span ends (per trace until the trace ends, for spans that never do).

Records are written when a span ends: a model span becomes a ``CallAnnotation`` (its
agent is the enclosing agent span's name; its parent, that agent span), a function or
handoff span a ``ToolStep`` whose parent is the model call of the same turn.

Every hook body is wrapped: a failure is logged and counted (``stats()``), never raised.
Every field is extracted on its own, so an odd field is left empty and the rest kept.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agents.tracing import (
    AgentSpanData,
    FunctionSpanData,
    GenerationSpanData,
    HandoffSpanData,
    ResponseSpanData,
    Span,
    Trace,
    TracingProcessor,
    TurnSpanData,
)

from boltrl._common import JSON
from boltrl.adapter_support import Counters, Installation, json_or_str, new_id
from boltrl.context import RolloutContext, current
from boltrl.records import CallAnnotation, ToolStep
from boltrl_openai_agents import _convert as cv

log = logging.getLogger(__name__)

FRAMEWORK = "openai-agents"

_UNKNOWN: Any = object()

_counters = Counters("boltrl_openai_agents", log, "calls", "tool_steps")
_field = _counters.field


stats = _counters.snapshot
"""Counters since import: ``calls`` and ``tool_steps`` recorded, ``failures`` (a hook
that could not record; logged) and ``field_failures`` (one field left empty)."""


@dataclass(slots=True)
class _Call:
    """The model call of a turn, kept for the tool spans that follow it."""

    span_id: str
    call_id: str | None
    tool_calls: list[JSON]
    used: set[int] = field(default_factory=set)


@dataclass(slots=True)
class _Open:
    """What is known about an open span of a rollout."""

    ctx: RolloutContext
    trace_id: str
    parent: _Open | None
    agent: str | None = None
    agent_span_id: str | None = None
    agent_tools: frozenset[str] = frozenset()
    call: _Call | None = None
    """Set on a turn (or agent) span by the model span that ends under it."""


@dataclass(slots=True)
class _Trace:
    ctx: RolloutContext
    spans: set[str] = field(default_factory=set)


class BoltrlTracingProcessor(TracingProcessor):
    """Records, inside a boltrl rollout, every model call and tool run of the Agents SDK.

    Register it once: ``agents.add_trace_processor(BoltrlTracingProcessor())`` (or
    ``boltrl_openai_agents.instrument()``). Outside a rollout it returns at once.
    Thread-safe; never blocks; never raises.
    """

    def __init__(self) -> None:
        self._spans: dict[str, _Open] = {}
        self._traces: dict[str, _Trace] = {}
        self._enabled = True
        self._recorders: dict[type, Callable[[Span[Any], Any, _Open], None] | None] = {
            GenerationSpanData: self._generation,
            ResponseSpanData: self._response,
            FunctionSpanData: self._function,
            HandoffSpanData: self._handoff,
        }

    def _recorder_for(self, kind: type) -> Callable[[Span[Any], Any, _Open], None] | None:
        """The recorder of a span-data type not seen before (a subclass, or one that
        records nothing: None), remembered."""
        found = next(
            (fn for base, fn in list(self._recorders.items()) if fn and issubclass(kind, base)),
            None,
        )
        self._recorders[kind] = found
        return found

    # -- traces ---------------------------------------------------------------------

    @_counters.guard()
    def on_trace_start(self, trace: Trace) -> None:
        ctx = current() if self._enabled else None
        if ctx is not None:
            self._traces[trace.trace_id] = _Trace(ctx)

    @_counters.guard()
    def on_trace_end(self, trace: Trace) -> None:
        t = self._traces.pop(trace.trace_id, None)
        if t is not None:
            for span_id in t.spans:
                self._spans.pop(span_id, None)

    # -- spans ----------------------------------------------------------------------

    @_counters.guard()
    def on_span_start(self, span: Span[Any]) -> None:
        parent = self._spans.get(span.parent_id) if span.parent_id else None
        trace = self._traces.get(span.trace_id)
        ctx = parent.ctx if parent else trace.ctx if trace else current()
        if ctx is None or not self._enabled:
            return
        st = _Open(ctx, span.trace_id, parent)
        if parent is not None:
            st.agent = parent.agent
            st.agent_span_id = parent.agent_span_id
            st.agent_tools = parent.agent_tools
        data = span.span_data
        if isinstance(data, AgentSpanData):
            st.agent = data.name
            st.agent_span_id = span.span_id
            st.agent_tools = frozenset(data.tools or ())
        elif isinstance(data, TurnSpanData) and data.agent_name:
            st.agent = data.agent_name
        self._spans[span.span_id] = st
        if trace is not None:
            trace.spans.add(span.span_id)

    @_counters.guard(lambda _self, span: f"recording a {type(span.span_data).__name__}")
    def on_span_end(self, span: Span[Any]) -> None:
        st = self._spans.pop(span.span_id, None)
        if st is None:
            return
        trace = self._traces.get(st.trace_id)
        if trace is not None:
            trace.spans.discard(span.span_id)
        recorder = self._recorders.get(type(span.span_data), _UNKNOWN)
        if recorder is _UNKNOWN:
            recorder = self._recorder_for(type(span.span_data))
        if recorder is not None:
            recorder(span, span.span_data, st)

    def shutdown(self) -> None:
        self._spans.clear()
        self._traces.clear()

    def force_flush(self) -> None:
        """Nothing is queued here: records go to the rollout as spans end."""

    # -- records --------------------------------------------------------------------

    def _annotate(
        self,
        span: Span[Any],
        st: _Open,
        call_id: str | None,
        request: list[JSON] | None,
        message: JSON | None,
    ) -> None:
        st.ctx.add(
            CallAnnotation(
                id=new_id("ann"),
                call_id=call_id,
                span_id=span.span_id,
                parent_id=st.agent_span_id,
                agent=st.agent,
                framework=FRAMEWORK,
                request_messages=request,
                response=None if message is None else {"message": message},
            )
        )
        _counters.count("calls")
        if st.parent is not None:
            tool_calls: list[JSON] = _field(cv.tool_calls_of, message) or []
            st.parent.call = _Call(span.span_id, call_id, tool_calls)

    def _generation(self, span: Span[Any], data: GenerationSpanData, st: _Open) -> None:
        out = _field(cv.generation_output, data.output)
        message, call_id = out if out is not None else (None, None)
        request = _field(cv.chat_messages, data.input)
        self._annotate(span, st, call_id, request, message)

    def _response(self, span: Span[Any], data: ResponseSpanData, st: _Open) -> None:
        resp = data.response
        call_id = _field(_response_id, data)
        instructions = _field(lambda: cv.instructions_text(cv.get(resp, "instructions")))
        request = (
            None if data.input is None else _field(cv.input_messages, data.input, instructions)
        )
        message = None if resp is None else _field(cv.output_message, cv.get(resp, "output"))
        self._annotate(span, st, call_id, request, message)

    def _tool_step(
        self,
        span: Span[Any],
        st: _Open,
        name: str,
        tool_call: JSON | None,
        *,
        arguments: Any,
        result: Any,
        error: str | None,
    ) -> None:
        call = st.parent.call if st.parent is not None else None
        st.ctx.add(
            ToolStep(
                id=new_id("tool"),
                name=name,
                arguments=arguments,
                result=result,
                error=error,
                parent_id=(call.call_id or call.span_id) if call else st.agent_span_id,
                call_id=call.call_id if call else None,
                tool_call_id=tool_call.get("id") if tool_call else None,
                agent=st.agent,
                started_at=_field(cv.span_time, span.started_at) or 0.0,
                ended_at=_field(cv.span_time, span.ended_at) or 0.0,
            )
        )
        _counters.count("tool_steps")

    def _function(self, span: Span[Any], data: FunctionSpanData, st: _Open) -> None:
        call = st.parent.call if st.parent is not None else None
        tool_call = (
            _field(cv.match_tool_call, call.tool_calls, call.used, data.name, data.input)
            if call
            else None
        )
        self._tool_step(
            span,
            st,
            data.name,
            tool_call,
            arguments=_field(cv.parse_arguments, data.input),
            result=_field(json_or_str, data.output),
            error=_field(cv.span_error, span.error),
        )

    def _handoff(self, span: Span[Any], data: HandoffSpanData, st: _Open) -> None:
        call = st.parent.call if st.parent is not None else None
        expected = cv.handoff_tool_name(data.to_agent or "")
        tool_call = None
        if call is not None:
            # A handoff is the agent's tool call that is not one of its function tools.
            free = [
                i
                for i, c in enumerate(call.tool_calls)
                if i not in call.used and c.get("name") not in st.agent_tools
            ]
            named = [i for i in free if call.tool_calls[i].get("name") == expected] or free
            if named:
                call.used.add(named[0])
                tool_call = call.tool_calls[named[0]]
        self._tool_step(
            span,
            st,
            (tool_call or {}).get("name") or expected,
            tool_call,
            arguments=_field(cv.parse_arguments, (tool_call or {}).get("arguments")),
            result={"from_agent": data.from_agent, "to_agent": data.to_agent},
            error=_field(cv.span_error, span.error),
        )


def _response_id(data: ResponseSpanData) -> str | None:
    rid = cv.get(data.response, "id") if data.response is not None else None
    if not isinstance(rid, str):
        rid = data.export().get("response_id")  # set without the response when data is redacted
    return rid if isinstance(rid, str) else None


# -- global install ------------------------------------------------------------------

_installation: Installation[BoltrlTracingProcessor] = Installation()


def _registered() -> tuple[TracingProcessor, ...] | None:
    """The provider's processors, when the SDK lets us see them (no public getter)."""
    from agents.tracing import get_trace_provider

    multi = getattr(get_trace_provider(), "_multi_processor", None)
    procs = getattr(multi, "_processors", None)
    return procs if isinstance(procs, tuple) else None


def instrument() -> BoltrlTracingProcessor:
    """Register one ``BoltrlTracingProcessor`` with the SDK's trace provider (idempotent)
    and return it. The SDK's other processors, the default OpenAI exporter included,
    stay registered: see the README to turn uploads off."""
    return _installation.instrument(_attach)


def _attach() -> tuple[BoltrlTracingProcessor, Callable[[], None]]:
    from agents.tracing import add_trace_processor, get_trace_provider

    processor = BoltrlTracingProcessor()
    add_trace_processor(processor)

    def detach() -> None:
        procs = _registered()
        if procs is None:
            log.warning(
                "boltrl_openai_agents: cannot list this SDK's trace processors; the "
                "processor stays registered but records nothing"
            )
        else:
            get_trace_provider().set_processors([p for p in procs if p is not processor])
        processor._enabled = False
        processor.shutdown()

    return processor, detach


def uninstrument() -> None:
    """Unregister the processor ``instrument()`` added, leaving the SDK's processor list
    as it was (idempotent)."""
    _installation.uninstrument()


def installed() -> BoltrlTracingProcessor | None:
    """The processor ``instrument()`` registered, if it is registered."""
    return _installation.installed()
