"""One engine request run with its log line and metrics: the only place either is kept."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import structlog

from vllm_mlx.api.errors import to_api_error
from vllm_mlx.api.pipeline.turn import Turn
from vllm_mlx.api.principal import current_principal
from vllm_mlx.engine.output import OutputEvent, RequestTrace, generate_text
from vllm_mlx.engine.types import Finished, GenerationRequest, raise_for_failure
from vllm_mlx.metrics.core import RequestMetrics
from vllm_mlx.telemetry import hooks as tracing
from vllm_mlx.usage.record import add_usage

log = structlog.get_logger("vllm_mlx.requests")


async def run(turn: Turn, request: GenerationRequest) -> AsyncIterator[OutputEvent]:
    """generate_text plus the one log line per request and its metrics.

    A generation that ended in an engine error or an abort raises here, so every
    protocol turns it into an error response, never a normal stop.
    """
    trace = RequestTrace(request.request_id, request.arrived_at)
    observed = _request_metrics(turn, request)
    status = 499  # the consumer left before the end (client disconnect)
    finished: Finished | None = None
    try:
        async for event in generate_text(turn.engine, request, trace):
            if isinstance(event, Finished):
                raise_for_failure(event.reason, event.message, event.refused)
                finished, status = event, 200
                if observed is not None:
                    observed.finished(trace, event.reason.value, time.monotonic())
            elif observed is not None:
                observed.update(trace)
            yield event
    except TimeoutError:
        status = 504
        if observed is not None:
            observed.aborted(trace, "timeout")
        raise
    except Exception as exc:
        status = to_api_error(exc).status
        if observed is not None:
            observed.failed(trace)
        raise
    finally:
        if status == 499 and observed is not None:
            observed.aborted(trace, "client_disconnect")
        _log_request(turn, request, trace, finished, status)
        _count_usage(request, trace, finished)
        reason = finished.reason.value if finished else None
        tracing.generation_done(trace, len(request.prompt_tokens), reason, status)
        if turn.metrics is not None:
            turn.metrics.activity.finished(trace.ttft)


def _count_usage(
    request: GenerationRequest, trace: RequestTrace, finished: Finished | None
) -> None:
    """What this run spent, for the key's usage: the prompt it was given (the cached
    part too) and what it generated, also when it ended early."""
    completion = finished.usage.completion_tokens if finished else len(trace.token_times)
    began = trace.prefill_started_at or trace.arrived_at
    seconds = (trace.finished_at or time.monotonic()) - began
    add_usage(len(request.prompt_tokens), trace.cached_tokens, completion, seconds)


def _request_metrics(turn: Turn, request: GenerationRequest) -> RequestMetrics | None:
    if turn.metrics is None:
        return None
    return turn.metrics.request(turn.name, len(request.prompt_tokens))


def _log_request(
    turn: Turn,
    request: GenerationRequest,
    trace: RequestTrace,
    finished: Finished | None,
    status: int,
) -> None:
    ttft = trace.ttft
    log.info(
        "request",
        request_id=request.request_id,
        route=turn.route,
        model=turn.model_id,
        key=caller.name if (caller := current_principal.get()) else None,  # a name, never a key
        status=status,
        prompt_tokens=len(request.prompt_tokens),
        cached_tokens=trace.cached_tokens,
        completion_tokens=finished.usage.completion_tokens if finished else len(trace.token_times),
        finish_reason=finished.reason.value if finished else None,
        ttft_s=round(ttft, 4) if ttft is not None else None,
        duration_s=round(time.monotonic() - request.arrived_at, 4),
    )
