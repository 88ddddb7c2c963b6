"""The tracing calls the request path makes: each a no-op when tracing is off.

The edge starts one span per HTTP request and keeps it in a context variable for that
request; the handler task copies the context, so every step below it (prompt
rendering, structured-output compile, MCP calls, the engine's phases) finds its
parent there. With tracing off no span is ever started, the variable stays None and
each hook is that one check: no OpenTelemetry module is imported at all (otel.py,
the implementation, is loaded by setup.py only when tracing is on).
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

# What an OpenTelemetry attribute may hold (a subset of its AttributeValue).
Value = str | bool | int | float | Sequence[str]
Attributes = Mapping[str, Value]


class GenerationTimes(Protocol):
    """One generation's timings (engine/output.py's RequestTrace), monotonic seconds."""

    request_id: str
    arrived_at: float
    prefill_started_at: float | None
    prefill_done_at: float | None
    first_token_at: float | None
    finished_at: float | None
    cached_tokens: int
    completion_tokens: int


class RequestSpan(Protocol):
    """The span of one HTTP request (otel.py's OtelRequestSpan)."""

    def child(self, name: str, attributes: Attributes) -> AbstractContextManager[object]: ...

    def record(
        self, name: str, start: float, end: float, attributes: Attributes, failed: bool
    ) -> None: ...

    def generation(
        self, times: GenerationTimes, prompt_tokens: int, finish_reason: str | None, status: int
    ) -> None: ...

    def end(self, route: str, status: int, note: Mapping[str, Any]) -> None: ...


class Tracing(Protocol):
    """A running tracer (otel.py's OtelTracing); None everywhere when tracing is off."""

    def start_request(
        self, method: str, path: str, headers: Mapping[str, str]
    ) -> RequestSpan | None: ...

    def shutdown(self) -> None: ...


_current: contextvars.ContextVar[RequestSpan | None] = contextvars.ContextVar(
    "vllm_mlx_request_span", default=None
)
_OFF: AbstractContextManager[object] = contextlib.nullcontext()


@dataclass(frozen=True)
class Started:
    """A request span and the context-variable token that ends its reign."""

    span: RequestSpan
    token: contextvars.Token[RequestSpan | None]


def start_request(
    tracing: Tracing | None, method: str, path: str, headers: Mapping[str, str]
) -> Started | None:
    """The request's span, current until end_request; None when off, not sampled or
    not traced (/health, /metrics): then nothing below it is traced either."""
    if tracing is None:
        return None
    span = tracing.start_request(method, path, headers)
    if span is None:
        return None
    return Started(span, _current.set(span))


def end_request(started: Started | None, route: str, status: int, note: Mapping[str, Any]) -> None:
    """End the span with the route template, the status and what the request noted
    (the model, the key's name)."""
    if started is None:
        return
    _current.reset(started.token)
    started.span.end(route, status, note)


def span(name: str, attributes: Attributes | None = None) -> AbstractContextManager[object]:
    """A child span around a block of the request's own work (an error inside marks it)."""
    current = _current.get()
    if current is None:
        return _OFF
    return current.child(name, attributes or {})


def record(
    name: str, started: float, attributes: Attributes | None = None, failed: bool = False
) -> None:
    """A child span, after the fact, from `started` (time.monotonic()) until now."""
    current = _current.get()
    if current is not None:
        current.record(name, started, time.monotonic(), attributes or {}, failed)


def tool_call(name: str, outcome: str, started: float) -> None:
    """An MCP tool call's span (outcome: ok, tool_error, timeout, unavailable)."""
    current = _current.get()
    if current is not None:
        attributes = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": name,
            "vllm_mlx.mcp.outcome": outcome,
        }
        failed = outcome != "ok"
        current.record(f"execute_tool {name}", started, time.monotonic(), attributes, failed)


def generation_done(
    times: GenerationTimes, prompt_tokens: int, finish_reason: str | None, status: int
) -> None:
    """Queue, prefill and decode spans of one generation; its tokens count on the request."""
    current = _current.get()
    if current is not None:
        current.generation(times, prompt_tokens, finish_reason, status)
