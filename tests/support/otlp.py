"""An OTLP/HTTP trace receiver for tests: what a collector would get, decoded.

It accepts POST /v1/traces (protobuf, as the OpenTelemetry exporter sends it), decodes
the body with the OpenTelemetry proto package and keeps every span; tests wait on a
condition for the spans they expect, never on a fixed sleep.
"""

from __future__ import annotations

import gzip
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan

WAIT_S = 30.0


def value_of(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [value_of(v) for v in value.array_value.values]
    return None if kind is None else getattr(value, kind)


@dataclass(frozen=True)
class Span:
    """One received span, with its ids as hex (as a traceparent writes them)."""

    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    status_code: int
    resource: dict[str, Any]

    @property
    def is_server(self) -> bool:
        return self.kind == ProtoSpan.SpanKind.SPAN_KIND_SERVER


def _spans(request: ExportTraceServiceRequest) -> Iterator[Span]:
    for resource_spans in request.resource_spans:
        resource = {a.key: value_of(a.value) for a in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                yield Span(
                    name=span.name,
                    trace_id=span.trace_id.hex(),
                    span_id=span.span_id.hex(),
                    parent_span_id=span.parent_span_id.hex(),
                    kind=span.kind,
                    start_ns=span.start_time_unix_nano,
                    end_ns=span.end_time_unix_nano,
                    attributes={a.key: value_of(a.value) for a in span.attributes},
                    status_code=span.status.code,
                    resource=resource,
                )


class Receiver:
    """The receiver on 127.0.0.1, on a free port, for a `with` block."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.posts = 0  # export requests seen, spans or not
        self._changed = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces":
                    self.send_error(404)
                    return
                receiver.add(ExportTraceServiceRequest.FromString(body))
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # quiet: pytest shows the assertions

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> Receiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def add(self, request: ExportTraceServiceRequest) -> None:
        with self._changed:
            self.posts += 1
            self.spans.extend(_spans(request))
            self._changed.notify_all()

    def wait_for(
        self, condition: Callable[[list[Span]], bool], what: str, timeout: float = WAIT_S
    ) -> list[Span]:
        """The spans received so far, once `condition` holds for them."""
        with self._changed:
            if not self._changed.wait_for(lambda: condition(self.spans), timeout):
                names = [(s.name, s.trace_id[:8]) for s in self.spans]
                raise TimeoutError(f"no {what} within {timeout} s; received {names}")
            return list(self.spans)

    def trace(self, trace_id: str, server_name: str, children: set[str]) -> list[Span]:
        """The spans of `trace_id` once its server span and the named children arrived."""

        def arrived(spans: list[Span]) -> bool:
            mine = [s for s in spans if s.trace_id == trace_id]
            names = {s.name for s in mine}
            return any(s.is_server and s.name == server_name for s in mine) and children <= names

        spans = self.wait_for(arrived, f"{server_name} with {sorted(children)} in {trace_id}")
        return [s for s in spans if s.trace_id == trace_id]
