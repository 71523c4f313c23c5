"""The LangChain callback handler and the global hook that installs it.

A model call is seen twice: ``on_chat_model_start`` (request, run ids, metadata) and
``on_llm_end`` / ``on_llm_error`` (response). The start is parked under its run id and
the annotation recorded at the end, so it carries the response id when the integration
passed one through. Tool runs are paired the same way. The rollout is looked up once,
at the start, and the records go to that rollout even if the end fires elsewhere.

Every hook body is wrapped: a failure is logged and counted (``stats()``), never raised.
Every field is extracted on its own, so an odd field is left empty and the rest kept.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.outputs import LLMResult

from boltrl.adapter_support import Counters, Installation
from boltrl.context import RolloutContext, current
from boltrl.records import CallAnnotation, ToolStep
from boltrl_langchain import _convert as cv

log = logging.getLogger(__name__)

FRAMEWORK = "langchain"
_MAX_OPEN = 10_000
"""Open runs / remembered tool-call ids kept per handler; beyond it the oldest go."""

_counters = Counters("boltrl_langchain", log, "calls", "cached_calls", "tool_steps")
_field = _counters.field


stats = _counters.snapshot
"""Counters since import: ``calls`` recorded (``cached_calls``: LangChain cache hits,
recorded apart), ``tool_steps``, ``failures`` (a hook that could not record; logged)
and ``field_failures`` (one field left empty)."""


def _tool_name(serialized: Mapping[str, Any] | None, kwargs: Mapping[str, Any]) -> str:
    name = _field(cv.serialized_name, serialized) or kwargs.get("name")
    return name if isinstance(name, str) else "tool"


def _str(run_id: UUID | None) -> str | None:
    return None if run_id is None else str(run_id)


_NODE_TAG = "graph:step:"
"""The tag LangGraph gives the run of each node it executes."""
_MAX_DEPTH = 32
"""Runs between a model call and its graph node (LangGraph nests a few: 3 for the
prebuilt ReAct agent)."""


@dataclass(slots=True, frozen=True)
class _Chain:
    parent: UUID | None
    name: str | None
    node: bool
    """A LangGraph node's run (its parent is the graph's run)."""


@dataclass(slots=True)
class _OpenCall:
    ctx: RolloutContext
    parent_id: str | None
    agent: str | None
    messages: list[dict[str, Any]] | None


@dataclass(slots=True)
class _OpenTool:
    ctx: RolloutContext
    name: str
    arguments: Any
    parent_id: str | None
    tool_call_id: str | None
    agent: str | None
    started_at: float


@dataclass(slots=True, frozen=True)
class _Requester:
    """The model call whose response asked for a tool call."""

    span_id: str
    call_id: str | None
    agent: str | None


class BoltrlCallbackHandler(BaseCallbackHandler):
    """Records every chat-model call and tool run inside a boltrl rollout.

    Attach it to any Runnable — a chat model, a chain, a LangGraph graph —
    with ``config={"callbacks": [BoltrlCallbackHandler()]}``, or install it everywhere
    with ``boltrl_langchain.instrument()``. Outside a rollout it does nothing. One
    instance may serve many rollouts and threads at once. Never raises.
    """

    run_inline = True
    """Called inline on the event loop (it never blocks) instead of in an executor."""
    raise_error = False

    def __init__(self) -> None:
        self._calls: dict[UUID, _OpenCall] = {}
        self._tools: dict[UUID, _OpenTool] = {}
        self._requesters: OrderedDict[tuple[str, int, str], _Requester] = OrderedDict()
        self._chains: dict[UUID, _Chain] = {}
        self._lock = threading.Lock()

    # Retriever, retry and custom events carry nothing we record; skipping them saves a
    # dispatch per event. (Tool events ride on ``ignore_agent``: keep it False.) Chain
    # events give the run tree its names: a LangGraph graph's name is only there.
    @property
    def ignore_retriever(self) -> bool:
        return True

    @property
    def ignore_retry(self) -> bool:
        return True

    @property
    def ignore_custom_event(self) -> bool:
        return True

    # -- chains: only their names and places in the run tree ----------------------------

    @_counters.guard()
    def on_chain_start(
        self,
        serialized: dict[str, Any] | None,
        inputs: Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if current() is None:
            return
        name = kwargs.get("name")
        node = any(t.startswith(_NODE_TAG) for t in tags or ())
        self._chains[run_id] = _Chain(parent_run_id, name if isinstance(name, str) else None, node)
        if len(self._chains) > _MAX_OPEN:
            self._evict(self._chains)

    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._chains.pop(run_id, None)

    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._chains.pop(run_id, None)

    def _graph_name(self, parent_run_id: UUID | None) -> str | None:
        """The name of the LangGraph graph whose node made a run (the run under
        ``parent_run_id``): up the run tree to the first graph node, then its parent."""
        chains = self._chains
        run = parent_run_id
        for _ in range(_MAX_DEPTH):
            chain = chains.get(run) if run is not None else None
            if chain is None:
                return None
            if chain.node:
                graph = chains.get(chain.parent) if chain.parent is not None else None
                return graph.name if graph is not None else None
            run = chain.parent
        return None

    # -- model calls ---------------------------------------------------------------------

    @_counters.guard()
    def on_chat_model_start(
        self,
        serialized: dict[str, Any],
        messages: list[list[Any]],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        ctx = current()
        if ctx is None:
            return
        prompt = messages[0] if messages else []
        self._open_call(ctx, prompt, run_id, parent_run_id, metadata, serialized, kwargs)

    @_counters.guard()
    def on_llm_start(
        self,
        serialized: dict[str, Any],
        prompts: list[str],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        ctx = current()
        if ctx is None:
            return
        prompt = prompts[:1]
        self._open_call(ctx, prompt, run_id, parent_run_id, metadata, serialized, kwargs)

    def _open_call(
        self,
        ctx: RolloutContext,
        prompt: Sequence[Any],
        run_id: UUID,
        parent_run_id: UUID | None,
        metadata: Mapping[str, Any] | None,
        serialized: Mapping[str, Any] | None,
        kwargs: Mapping[str, Any],
    ) -> None:
        self._calls[run_id] = _OpenCall(
            ctx=ctx,
            parent_id=_str(parent_run_id),
            agent=_field(
                cv.agent_name,
                metadata,
                kwargs.get("name"),
                serialized,
                self._graph_name(parent_run_id),
            ),
            messages=_field(cv.messages_to_openai, prompt),
        )
        if len(self._calls) > _MAX_OPEN:
            self._evict(self._calls)

    @_counters.guard()
    def on_llm_end(
        self,
        response: LLMResult,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        call = self._calls.pop(run_id, None)
        if call is None:
            return
        self._close_call(call, run_id, response, None)

    @_counters.guard()
    def on_llm_error(
        self,
        error: BaseException,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        call = self._calls.pop(run_id, None)
        if call is None:
            return
        self._close_call(call, run_id, None, error)

    def _close_call(
        self,
        call: _OpenCall,
        run_id: UUID,
        result: LLMResult | None,
        error: BaseException | None,
    ) -> None:
        span_id = str(run_id)
        if error is None:
            response = _field(cv.response_of, result)
            cached = bool(_field(cv.is_cache_hit, result))
            # a cache hit carries the id of the call that filled the cache, a call of
            # another time (or rollout): this one has no gateway record
            call_id = None if cached else _field(cv.response_id, result)
        else:
            call_id, cached = None, False
            response = {"error": _field(cv.error_text, error)}
        ann = CallAnnotation(
            id=f"ann-{span_id}",  # the run id: unique, and a retried write stays one record
            call_id=call_id,
            span_id=span_id,
            parent_id=call.parent_id,
            agent=call.agent,
            framework=FRAMEWORK,
            request_messages=call.messages,
            response=response,
            cached=cached,
        )
        call.ctx.add(ann)
        _counters.count("cached_calls" if cached else "calls")
        message = (response or {}).get("message") or {}
        for tc in message.get("tool_calls") or ():
            tcid = tc.get("id") if isinstance(tc, dict) else None
            if isinstance(tcid, str):
                self._remember(call.ctx, tcid, _Requester(span_id, call_id, call.agent))

    def _remember(self, ctx: RolloutContext, tool_call_id: str, who: _Requester) -> None:
        key = (ctx.rollout_id, ctx.attempt.number, tool_call_id)
        with self._lock:
            self._requesters[key] = who
            if len(self._requesters) > _MAX_OPEN:
                self._requesters.popitem(last=False)

    def _requester(self, ctx: RolloutContext, tool_call_id: str | None) -> _Requester | None:
        if tool_call_id is None:
            return None
        with self._lock:
            return self._requesters.get((ctx.rollout_id, ctx.attempt.number, tool_call_id))

    def _evict(self, runs: dict[UUID, Any]) -> None:
        with self._lock:
            while len(runs) > _MAX_OPEN:
                try:
                    runs.pop(next(iter(runs)))
                except (StopIteration, KeyError, RuntimeError):
                    break
        log.warning("boltrl_langchain: over %d open runs; dropped the oldest", _MAX_OPEN)

    # -- tools ---------------------------------------------------------------------------

    @_counters.guard()
    def on_tool_start(
        self,
        serialized: dict[str, Any],
        input_str: str,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        inputs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        ctx = current()
        if ctx is None:
            return
        tcid = kwargs.get("tool_call_id")
        self._tools[run_id] = _OpenTool(
            ctx=ctx,
            name=_tool_name(serialized, kwargs),
            arguments=_field(cv.tool_arguments, input_str, inputs),
            parent_id=_str(parent_run_id),
            tool_call_id=tcid if isinstance(tcid, str) else None,
            agent=_field(cv.agent_name, metadata, None, None),
            started_at=time.time(),
        )
        if len(self._tools) > _MAX_OPEN:
            self._evict(self._tools)

    @_counters.guard()
    def on_tool_end(
        self,
        output: Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        tool = self._tools.pop(run_id, None)
        if tool is None:
            return
        result = _field(cv.tool_result, output)
        self._close_tool(run_id, tool, result, None, _field(cv.tool_call_id_of, output))

    @_counters.guard()
    def on_tool_error(
        self,
        error: BaseException,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        tool = self._tools.pop(run_id, None)
        if tool is None:
            return
        self._close_tool(run_id, tool, None, _field(cv.error_text, error), None)

    def _close_tool(
        self,
        run_id: UUID,
        tool: _OpenTool,
        result: Any,
        error: str | None,
        tool_call_id: str | None,
    ) -> None:
        tcid = tool.tool_call_id or tool_call_id
        who = self._requester(tool.ctx, tcid)
        # The parent is the model call that asked for the tool: its response id when the
        # integration exposed one, else its run id (the join maps run ids to call ids).
        parent = (who.call_id or who.span_id) if who is not None else tool.parent_id
        step = ToolStep(
            id=f"tool-{run_id}",
            name=tool.name,
            arguments=tool.arguments,
            result=result,
            error=error,
            parent_id=parent,
            call_id=who.call_id if who is not None else None,
            tool_call_id=tcid,
            agent=who.agent if who is not None and who.agent else tool.agent,
            started_at=tool.started_at,
            ended_at=time.time(),
        )
        tool.ctx.add(step)
        _counters.count("tool_steps")


# -- global install ----------------------------------------------------------------------

_installation: Installation[BoltrlCallbackHandler] = Installation()


def instrument(handler: BoltrlCallbackHandler | None = None) -> BoltrlCallbackHandler:
    """Attach a ``BoltrlCallbackHandler`` to every LangChain run in the process.

    Uses langchain-core's configure hook (``register_configure_hook``): each callback
    manager LangChain builds gets the handler, unless the run already carries a
    ``BoltrlCallbackHandler`` (so an explicit one is never doubled). Idempotent: a second
    call returns the installed handler. Returns the handler.
    """
    return _installation.instrument(
        lambda: _attach(handler if handler is not None else BoltrlCallbackHandler())
    )


def _attach(h: BoltrlCallbackHandler) -> tuple[BoltrlCallbackHandler, Callable[[], None]]:
    from langchain_core.tracers import context as lc_context

    # A default (not a value set in one context) is seen by every thread and task.
    var: ContextVar[BoltrlCallbackHandler | None] = ContextVar(
        "boltrl_langchain_handler", default=h
    )
    lc_context.register_configure_hook(var, True, BoltrlCallbackHandler)
    entry = lc_context._configure_hooks[-1]

    def detach() -> None:
        # by identity: the list may have gained other hooks since
        hooks = lc_context._configure_hooks
        for i, e in enumerate(hooks):
            if e is entry:
                del hooks[i]
                break

    return h, detach


def uninstrument() -> None:
    """Remove what ``instrument()`` installed, leaving LangChain exactly as it was.
    Idempotent."""
    _installation.uninstrument()


def installed() -> BoltrlCallbackHandler | None:
    """The handler ``instrument()`` installed, or None."""
    return _installation.installed()
