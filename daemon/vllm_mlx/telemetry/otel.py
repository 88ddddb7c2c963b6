"""The OpenTelemetry SDK behind hooks.py: a tracer exporting OTLP/HTTP in batches.

The only module that imports the SDK; setup.py loads it when tracing is on. Spans of
the engine's phases are made after the fact from RequestTrace's monotonic timestamps,
moved onto the wall clock with one offset taken when tracing starts.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from vllm_mlx import __version__
from vllm_mlx.telemetry.hooks import Attributes, GenerationTimes, Value

# A stop waits this long for the last spans; an unreachable collector must not hold
# the daemon's exit past its service manager's stop timeout.
SHUTDOWN_TIMEOUT_S = 5.0
# Probes and scrapes: most of a daemon's requests, and they say nothing about its work.
UNTRACED_PATHS = frozenset({"/health", "/metrics"})


def make_tracing(endpoint: str | None, sampling_ratio: float, service_name: str) -> OtelTracing:
    """A tracer sending to `endpoint` (None: the exporter reads OTEL_EXPORTER_OTLP_*)."""
    provider = TracerProvider(
        sampler=ParentBased(TraceIdRatioBased(sampling_ratio)),
        resource=Resource.create({SERVICE_NAME: service_name}),
        shutdown_on_exit=False,  # the daemon shuts it down, bounded (OtelTracing.shutdown)
    )
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    return OtelTracing(provider)


class OtelTracing:
    def __init__(self, provider: TracerProvider) -> None:
        self._provider = provider
        # Our own provider, not the global one: nothing else in the process traces
        # through it, and a test process may start several daemons' apps.
        self._tracer = provider.get_tracer("vllm_mlx", __version__)
        self._propagator = TraceContextTextMapPropagator()
        self._epoch_offset_ns = time.time_ns() - time.monotonic_ns()

    def start_request(
        self, method: str, path: str, headers: Mapping[str, str]
    ) -> OtelRequestSpan | None:
        if path in UNTRACED_PATHS:
            return None
        # A client's `traceparent` makes this span a child of its own (and its sampled
        # flag decides, through ParentBased); without one the ratio does.
        parent = self._propagator.extract(headers)
        span = self._tracer.start_span(
            method, parent, kind=SpanKind.SERVER, attributes={"http.request.method": method}
        )
        if not span.is_recording():
            return None
        token = otel_context.attach(trace.set_span_in_context(span, parent))
        return OtelRequestSpan(self._tracer, span, method, token, self._epoch_offset_ns)

    def shutdown(self) -> None:
        """Export what is queued, waiting at most SHUTDOWN_TIMEOUT_S."""
        worker = threading.Thread(target=self._provider.shutdown, name="otel-shutdown", daemon=True)
        worker.start()
        worker.join(SHUTDOWN_TIMEOUT_S)


class OtelRequestSpan:
    """The SERVER span of one HTTP request, and the tokens its generations used."""

    def __init__(
        self,
        tracer: trace.Tracer,
        span: trace.Span,
        method: str,
        token: contextvars.Token[Context],
        epoch_offset_ns: int,
    ) -> None:
        self._tracer = tracer
        self._span = span
        self._method = method
        self._token = token
        self._offset_ns = epoch_offset_ns
        self._parent = trace.set_span_in_context(span)
        self._prompt = self._completion = self._cached = 0
        self._generations = 0
        self._reasons: list[str] = []
        self._failure: str | None = None

    def _ns(self, monotonic_s: float) -> int:
        return int(monotonic_s * 1e9) + self._offset_ns

    def child(self, name: str, attributes: Attributes) -> AbstractContextManager[object]:
        return self._tracer.start_as_current_span(name, attributes=attributes)

    def record(
        self, name: str, start: float, end: float, attributes: Attributes, failed: bool
    ) -> None:
        # Parented explicitly: an after-the-fact span may be made outside the handler's
        # own context (an async generator closed elsewhere).
        span = self._tracer.start_span(
            name, self._parent, attributes=attributes, start_time=self._ns(start)
        )
        if failed:
            span.set_status(Status(StatusCode.ERROR))
        span.end(end_time=self._ns(max(start, end)))

    def generation(
        self, times: GenerationTimes, prompt_tokens: int, finish_reason: str | None, status: int
    ) -> None:
        end = times.finished_at or time.monotonic()
        ids: dict[str, Value] = {"vllm_mlx.request_id": times.request_id}
        failed = status >= 500
        if times.prefill_done_at is None:  # ended before its prefill did (queued, aborted)
            self.record("engine.queue", times.arrived_at, end, ids, failed)
        else:
            started = times.prefill_started_at or times.arrived_at
            self.record("engine.queue", times.arrived_at, started, ids, False)
            prefill = {**ids, "gen_ai.usage.input_tokens": prompt_tokens}
            prefill["gen_ai.usage.cache_read.input_tokens"] = times.cached_tokens
            self.record("engine.prefill", started, times.prefill_done_at, prefill, False)
            decode = {**ids, "gen_ai.usage.output_tokens": times.completion_tokens}
            if finish_reason is not None:
                decode["gen_ai.response.finish_reasons"] = [finish_reason]
            self.record("engine.decode", times.prefill_done_at, end, decode, failed)
        self._generations += 1
        self._prompt += prompt_tokens
        self._completion += times.completion_tokens
        self._cached += times.cached_tokens
        if finish_reason is not None:
            self._reasons.append(finish_reason)
        if failed:  # a stream's generation can fail after its 200 went out
            self._failure = f"generation failed ({status})"

    def end(self, route: str, status: int, note: Mapping[str, Any]) -> None:
        otel_context.detach(self._token)
        span = self._span
        if route != "unmatched":  # a path no route has: the method alone names it
            span.update_name(f"{self._method} {route}")
            span.set_attribute("http.route", route)
        span.set_attribute("http.response.status_code", status)
        if isinstance(model := note.get("model"), str):
            span.set_attribute("gen_ai.request.model", model)
        if isinstance(key := note.get("key"), str):
            span.set_attribute("vllm_mlx.key", key)  # the key's name, never the key
        if self._generations:
            span.set_attribute("gen_ai.usage.input_tokens", self._prompt)
            span.set_attribute("gen_ai.usage.output_tokens", self._completion)
            span.set_attribute("gen_ai.usage.cache_read.input_tokens", self._cached)
        if self._reasons:
            span.set_attribute("gen_ai.response.finish_reasons", self._reasons)
        if status >= 500:  # 4xx is the client's error, not the server's (HTTP semconv)
            span.set_status(Status(StatusCode.ERROR, f"HTTP {status}"))
        elif self._failure is not None:
            span.set_status(Status(StatusCode.ERROR, self._failure))
        span.end()
