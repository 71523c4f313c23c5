"""A tiny OTLP/HTTP trace receiver for tests: decodes ``ExportTraceServiceRequest``
protobufs (with ``opentelemetry-proto``) into plain dicts."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, kind) if kind else None


def _attrs(kvs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs}


@dataclass
class Span:
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    kind: int
    start: int
    end: int
    status: int
    status_message: str
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]]
    resource: dict[str, Any]
    scope: str


@dataclass
class Receiver:
    url: str
    spans: list[Span] = field(default_factory=list)
    requests: int = 0
    refuse: bool = False
    """Answer 400 to every export (to test the error path)."""

    def traces(self) -> dict[str, list[Span]]:
        out: dict[str, list[Span]] = {}
        for s in self.spans:
            out.setdefault(s.trace_id, []).append(s)
        return out


def start() -> tuple[Receiver, ThreadingHTTPServer]:
    receiver = Receiver("")
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if receiver.refuse or self.path != "/v1/traces":
                self.send_response(400)
                self.end_headers()
                return
            req = ExportTraceServiceRequest.FromString(body)
            with lock:
                receiver.requests += 1
                for rs in req.resource_spans:
                    res = _attrs(rs.resource.attributes)
                    for ss in rs.scope_spans:
                        for s in ss.spans:
                            receiver.spans.append(
                                Span(
                                    name=s.name,
                                    trace_id=s.trace_id.hex(),
                                    span_id=s.span_id.hex(),
                                    parent_id=s.parent_span_id.hex(),
                                    kind=s.kind,
                                    start=s.start_time_unix_nano,
                                    end=s.end_time_unix_nano,
                                    status=s.status.code,
                                    status_message=s.status.message,
                                    attributes=_attrs(s.attributes),
                                    events=[(e.name, _attrs(e.attributes)) for e in s.events],
                                    resource=res,
                                    scope=ss.scope.name,
                                )
                            )
            out = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return receiver, server
