"""Shared request plumbing for both protocols: model lookup, defaults, limits, logging."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import structlog

from vllm_mlx.api.errors import APIError, model_not_found
from vllm_mlx.api.state import ServerState
from vllm_mlx.config import Settings
from vllm_mlx.engine.engine import Engine
from vllm_mlx.engine.output import OutputEvent, RequestTrace, generate_text
from vllm_mlx.engine.registry import LoadState
from vllm_mlx.engine.types import Finished, GenerationRequest, SamplingParams

log = structlog.get_logger("vllm_mlx.requests")


@dataclass(frozen=True)
class Target:
    """A request's resolved model: the id the client used, the engine, the settings."""

    model_id: str
    engine: Engine
    settings: Settings


def resolve_target(state: ServerState, model_id: str) -> Target:
    settings = state.settings
    if state.draining:
        raise APIError(503, "the server is shutting down", "unavailable", code="shutting_down")
    entry = state.registry.resolve(model_id)
    if entry is None:
        raise model_not_found(model_id)
    if entry.state is not LoadState.RUNNING or entry.engine is None:
        raise APIError(
            503, f"model '{model_id}' is {entry.state.value}", "unavailable", code="model_not_ready"
        )
    return Target(model_id, entry.engine, settings)


def new_request_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def sampling_params(
    settings: Settings,
    *,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    min_p: float | None = None,
    seed: int | None = None,
    repetition_penalty: float | None = None,
    presence_penalty: float | None = None,
    frequency_penalty: float | None = None,
    logit_bias: dict[int, float] | None = None,
) -> SamplingParams:
    """Request values over the configured defaults."""
    d = settings.defaults
    return SamplingParams(
        temperature=d.temperature if temperature is None else temperature,
        top_p=d.top_p if top_p is None else top_p,
        top_k=d.top_k if top_k is None else top_k,
        min_p=d.min_p if min_p is None else min_p,
        seed=seed,
        repetition_penalty=d.repetition_penalty
        if repetition_penalty is None
        else repetition_penalty,
        presence_penalty=presence_penalty or 0.0,
        frequency_penalty=frequency_penalty or 0.0,
        logit_bias=logit_bias,
    )


def build_request(
    target: Target,
    request_id: str,
    prompt_tokens: list[int],
    max_tokens: int | None,
    sampling: SamplingParams,
    stop: tuple[str, ...],
) -> GenerationRequest:
    settings = target.settings
    wanted = settings.defaults.max_tokens if max_tokens is None else max_tokens
    wanted = min(wanted, settings.limits.max_request_tokens)
    allowed = target.engine.check_fits(len(prompt_tokens), wanted)
    now = time.monotonic()
    return GenerationRequest(
        request_id=request_id,
        prompt_tokens=prompt_tokens,
        max_tokens=allowed,
        sampling=sampling,
        stop=stop,
        arrived_at=now,
        deadline=now + settings.server.timeout,
    )


async def run(target: Target, request: GenerationRequest, route: str) -> AsyncIterator[OutputEvent]:
    """generate_text plus the one log line per request."""
    trace = RequestTrace(request.request_id, request.arrived_at)
    status = 499  # the consumer left before the end (client disconnect)
    finished: Finished | None = None
    try:
        async for event in generate_text(target.engine, request, trace):
            if isinstance(event, Finished):
                finished, status = event, 200
            yield event
    except TimeoutError:
        status = 504
        raise
    except Exception:
        status = 500
        raise
    finally:
        _log_request(target, request, trace, finished, status, route)


def _log_request(
    target: Target,
    request: GenerationRequest,
    trace: RequestTrace,
    finished: Finished | None,
    status: int,
    route: str,
) -> None:
    ttft = trace.ttft
    log.info(
        "request",
        request_id=request.request_id,
        route=route,
        model=target.model_id,
        status=status,
        prompt_tokens=len(request.prompt_tokens),
        completion_tokens=finished.usage.completion_tokens if finished else len(trace.token_times),
        finish_reason=finished.reason.value if finished else None,
        ttft_s=round(ttft, 4) if ttft is not None else None,
        duration_s=round(time.monotonic() - request.arrived_at, 4),
    )
