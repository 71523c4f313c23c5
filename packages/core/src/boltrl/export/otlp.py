"""Rollouts as OpenTelemetry traces, with the GenAI semantic conventions, over OTLP/HTTP.

One trace per rollout, so the same traces open in Jaeger, Phoenix or Langfuse:

- the rollout is the root span (``rollout``, ``gen_ai.operation.name=invoke_agent``);
- each attempt a child span (``attempt N``; its error as an ``exception`` event);
- a framework span that recorded nothing itself (an agent's turn) an ``invoke_agent
  {agent}`` span;
- each model call a ``chat {model}`` client span carrying ``gen_ai.request.model``,
  ``gen_ai.response.id`` (the gateway's response id), ``gen_ai.usage.*``,
  ``gen_ai.response.finish_reasons``, ``gen_ai.agent.name`` and, unless content is
  turned off, ``gen_ai.input.messages`` / ``gen_ai.output.messages``;
- each tool step an ``execute_tool {name}`` span (``gen_ai.tool.name``, arguments and
  result);
- each reward a ``boltrl.reward`` event on the span of the call it names (else its
  attempt).

Parents follow the call tree of ``boltrl.dashboard.tree``. Trace and span ids are
derived from the rollout and record ids, so exporting a rollout twice yields the same
ids. Needs the ``otel`` extra (``pip install 'boltrl[otel]'``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from boltrl import __version__
from boltrl.dashboard.tree import Node, build_tree
from boltrl.errors import BoltrlError
from boltrl.export.genai import call_attributes, tool_attributes
from boltrl.records import RewardEvent, Rollout

_ERROR_OUTCOMES = ("failed", "timeout", "lease_expired", "cancelled")


class MissingExtra(BoltrlError, ImportError):
    """An optional dependency of the feature is not installed."""

    code = "missing_extra"


def require_otel() -> None:
    """Raise ``MissingExtra`` (saying what to install) unless the OTLP exporter imports."""
    try:
        import opentelemetry.exporter.otlp.proto.http.trace_exporter as _exporter
        import opentelemetry.sdk.trace as _sdk

        del _exporter, _sdk
    except ImportError as e:
        raise MissingExtra(
            f"OpenTelemetry export needs the otel extra ({e.name} is missing): "
            "pip install 'boltrl[otel]'"
        ) from None


def _id(nbytes: int, *parts: str) -> int:
    digest = hashlib.sha256("\x00".join(parts).encode()).digest()
    return int.from_bytes(digest[:nbytes], "big") or 1


def _ns(t: float) -> int:
    return int(t * 1e9)


def traces_endpoint(endpoint: str) -> str:
    """``http://host:4318`` → ``http://host:4318/v1/traces``; a URL with a path is kept."""
    base = endpoint.rstrip("/")
    scheme_sep = base.find("://")
    path = base[scheme_sep + 3 :].partition("/")[2] if scheme_sep >= 0 else ""
    return base if path else base + "/v1/traces"


class _Builder:
    """Turns one rollout into ReadableSpans."""

    def __init__(self, rollout: Rollout, resource: Any, scope: Any, content: bool) -> None:
        self.r = rollout
        self.resource = resource
        self.scope = scope
        self.content = content
        self.trace_id = _id(16, "trace", rollout.id)
        self.spans: list[Any] = []

    def _ctx(self, key: str) -> Any:
        from opentelemetry.trace import SpanContext, TraceFlags

        span_id = _id(8, self.r.id, key)
        return SpanContext(self.trace_id, span_id, is_remote=False, trace_flags=TraceFlags(1))

    def span(
        self,
        key: str,
        name: str,
        parent: str | None,
        start: float,
        end: float,
        attrs: Mapping[str, Any],
        *,
        events: Sequence[Any] = (),
        error: str | None = None,
        client: bool = False,
    ) -> None:
        from opentelemetry.sdk.trace import ReadableSpan
        from opentelemetry.trace import SpanKind, Status, StatusCode

        status = Status(StatusCode.ERROR, error) if error else Status(StatusCode.UNSET)
        clean = {k: v for k, v in attrs.items() if v is not None}
        self.spans.append(
            ReadableSpan(
                name,
                context=self._ctx(key),
                parent=None if parent is None else self._ctx(parent),
                resource=self.resource,
                attributes=clean,
                events=events,
                kind=SpanKind.CLIENT if client else SpanKind.INTERNAL,
                status=status,
                start_time=_ns(start),
                end_time=_ns(max(end, start)),
                instrumentation_scope=self.scope,
            )
        )

    def build(self) -> list[Any]:
        r = self.r
        roots = build_tree(r)
        start = min([r.created_at, *(n.start for n in roots if n.start)], default=r.created_at)
        end = max([r.finished_at or 0.0, *(n.end for n in roots)], default=start)
        meta = r.task.metadata
        self.span(
            "rollout",
            "rollout",
            None,
            start,
            end,
            {
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.conversation.id": r.id,
                "boltrl.rollout.id": r.id,
                "boltrl.rollout.status": r.status.value,
                "boltrl.rollout.reward": r.reward,
                "boltrl.rollout.attempts": len(r.attempts),
                "boltrl.task.id": r.task.id,
                "boltrl.task.group": r.task.group,
                "boltrl.task.split": r.task.split,
                "boltrl.run": _scalar(meta.get("run")),
                "boltrl.phase": _scalar(meta.get("phase")),
                "boltrl.step": _scalar(meta.get("step")),
            },
            error=r.error if r.status.value == "failed" else None,
        )
        for root in roots:
            self.attempt(root)
        return self.spans

    def attempt(self, node: Node) -> None:
        from opentelemetry.sdk.trace import Event

        att = next((a for a in self.r.attempts if a.number == node.attempt), None)
        events = [self.reward(c) for c in node.children if c.kind == "reward"]
        error = None
        if att is not None and att.outcome.value in _ERROR_OUTCOMES:
            error = att.error or att.outcome.value
            events.append(
                Event(
                    "exception",
                    {
                        "exception.type": att.error_kind or att.outcome.value,
                        "exception.message": (att.error or "").splitlines()[-1:][0]
                        if att.error
                        else "",
                        "exception.stacktrace": att.error or "",
                    },
                    timestamp=_ns(att.ended_at or node.end),
                )
            )
        self.span(
            node.id,
            f"attempt {node.attempt}",
            "rollout",
            node.start,
            node.end,
            {
                "boltrl.attempt.number": node.attempt,
                "boltrl.worker.id": None if att is None else att.worker_id,
                "boltrl.attempt.outcome": None if att is None else att.outcome.value,
                "error.type": None if att is None else att.error_kind,
            },
            events=events,
            error=error,
        )
        for child in node.children:
            self.node(child)

    def reward(self, node: Node) -> Any:
        from opentelemetry.sdk.trace import Event

        ev = node.record
        assert isinstance(ev, RewardEvent)
        attrs: dict[str, str | float | bool] = {
            "boltrl.reward.name": ev.name,
            "boltrl.reward.value": ev.value,
            "boltrl.reward.final": ev.final,
        }
        if ev.call_id:
            attrs["boltrl.reward.call_id"] = ev.call_id
        return Event("boltrl.reward", attrs, timestamp=_ns(ev.timestamp or node.start))

    def node(self, node: Node) -> None:
        if node.kind == "reward":
            return  # an event of its parent
        events = [self.reward(c) for c in node.children if c.kind == "reward"]
        if node.kind == "span":
            name = f"invoke_agent {node.agent}" if node.agent else "invoke_agent"
            attrs = {
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": node.agent,
                "boltrl.span.id": node.id.split(":", 2)[-1],
            }
            self.span(node.id, name, node.parent, node.start, node.end, attrs, events=events)
        elif node.kind == "call":
            name, attrs, error = call_attributes(node, self.r.id, self.content)
            self.span(
                node.id,
                name,
                node.parent,
                node.start,
                node.end,
                attrs,
                events=events,
                error=error,
                client=True,
            )
        elif node.kind == "tool":
            name, attrs, error = tool_attributes(node, self.content)
            self.span(
                node.id, name, node.parent, node.start, node.end, attrs, events=events, error=error
            )
        for child in node.children:
            self.node(child)


def _scalar(v: Any) -> Any:
    if v is None or isinstance(v, str | bool | int | float):
        return v
    return json.dumps(v)


def rollout_spans(
    rollout: Rollout, *, service_name: str = "boltrl", content: bool = True
) -> list[Any]:
    """The OpenTelemetry ``ReadableSpan``s of one rollout (see the module docstring)."""
    require_otel()
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    resource = Resource.create({"service.name": service_name})
    scope = InstrumentationScope("boltrl", __version__)
    return _Builder(rollout, resource, scope, content).build()


class OtlpExporter:
    """Sends rollouts to an OTLP/HTTP (protobuf) endpoint. Not thread-safe."""

    def __init__(
        self,
        endpoint: str,
        *,
        headers: Mapping[str, str] | None = None,
        service_name: str = "boltrl",
        content: bool = True,
        timeout_s: float = 10.0,
    ) -> None:
        require_otel()
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        self.endpoint = traces_endpoint(endpoint)
        self.service_name = service_name
        self.content = content
        self._exporter = OTLPSpanExporter(
            endpoint=self.endpoint, headers=dict(headers or {}), timeout=timeout_s
        )

    def export(self, rollouts: Iterable[Rollout]) -> int:
        """Export the rollouts' spans in one request; returns how many spans were sent.

        Raises ``BoltrlError`` when the endpoint refuses them.
        """
        from opentelemetry.sdk.trace.export import SpanExportResult

        spans: list[Any] = []
        for r in rollouts:
            spans += rollout_spans(r, service_name=self.service_name, content=self.content)
        if not spans:
            return 0
        if self._exporter.export(spans) is not SpanExportResult.SUCCESS:
            raise BoltrlError(f"the OTLP endpoint {self.endpoint} did not accept the spans")
        return len(spans)

    def close(self) -> None:
        self._exporter.shutdown()  # type: ignore[no-untyped-call]
