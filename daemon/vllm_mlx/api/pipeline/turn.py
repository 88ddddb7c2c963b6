"""Shared request plumbing for both protocols: model lookup, defaults, limits, logging."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from contextlib import aclosing
from dataclasses import dataclass, replace

import structlog

from vllm_mlx.api.errors import bad_request, to_api_error
from vllm_mlx.api.models import acquire, served_entry
from vllm_mlx.api.state import ServerState
from vllm_mlx.config.model import ModelSettings
from vllm_mlx.config.settings import Settings
from vllm_mlx.engine.engine import Engine
from vllm_mlx.engine.output import OutputEvent, RequestTrace, generate_text
from vllm_mlx.engine.types import (
    Finished,
    FinishReason,
    GenerationRequest,
    SamplingParams,
    TextDelta,
    raise_for_failure,
)
from vllm_mlx.metrics.core import Metrics, RequestMetrics
from vllm_mlx.parsers.pipeline import OutputParser, make_output_parser
from vllm_mlx.parsers.reasoning import get_reasoning_parser
from vllm_mlx.parsers.types import (
    ContentDelta,
    ReasoningDelta,
    ToolCallArgumentsDelta,
    ToolCallStart,
    ToolSpec,
)

log = structlog.get_logger("vllm_mlx.requests")


@dataclass(frozen=True)
class Target:
    """A request's resolved model: the id the client used, the engine, the settings."""

    model_id: str
    engine: Engine
    settings: Settings
    name: str = ""  # the served model's name (model_id may be an alias)
    metrics: Metrics | None = None


async def resolve_target(state: ServerState, model_id: str) -> Target:
    """The model's engine, loaded first when needed, held until the response is over."""
    entry = served_entry(state, model_id)
    if entry.settings.task == "embed":
        raise bad_request(
            f"model '{model_id}' is an embedding model: it serves POST /v1/embeddings only, "
            f"not text generation",
            "model",
            "model_not_generative",
        )
    await acquire(state, entry, model_id)
    assert entry.engine is not None  # acquire: running, and a generation model's runner
    scheduler = entry.engine.scheduler
    if scheduler.on_step is None:
        # Steps only happen for submitted requests, so hooking here misses none.
        scheduler.on_step = state.metrics.step_hook(entry.settings.name)
    return Target(model_id, entry.engine, state.settings, entry.settings.name, state.metrics)


def new_request_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def sampling_params(
    target: Target,
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
    """Request values over the configured defaults, checked against the model.

    Every value the engine could not sample with is a 400 naming its field here, so
    no request reaches a shared batch step with one.
    """
    d = target.settings.defaults
    vocab_size = target.engine.vocab_size
    if top_k is not None and top_k >= vocab_size:
        top_k = 0  # keeping the k most likely of fewer than k tokens keeps them all
    params = SamplingParams(
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
    for param, message in params.problems(vocab_size):
        raise bad_request(message, param)
    return params


def build_request(
    target: Target,
    request_id: str,
    prompt_tokens: list[int],
    max_tokens: int | None,
    sampling: SamplingParams,
    stop: tuple[str, ...],
    timeout: float | None = None,
) -> GenerationRequest:
    """`timeout` (the request's own) may lower server.timeout, never raise it."""
    settings = target.settings
    wanted = settings.defaults.max_tokens if max_tokens is None else max_tokens
    wanted = min(wanted, settings.limits.max_request_tokens)
    allowed = target.engine.check_fits(len(prompt_tokens), wanted)
    now = time.monotonic()
    limit = settings.server.timeout if timeout is None else min(timeout, settings.server.timeout)
    return GenerationRequest(
        request_id=request_id,
        prompt_tokens=prompt_tokens,
        max_tokens=allowed,
        sampling=sampling,
        stop=stop,
        arrived_at=now,
        deadline=now + limit,
    )


async def run(target: Target, request: GenerationRequest, route: str) -> AsyncIterator[OutputEvent]:
    """generate_text plus the one log line per request and its metrics."""
    trace = RequestTrace(request.request_id, request.arrived_at)
    observed = _request_metrics(target, request)
    status = 499  # the consumer left before the end (client disconnect)
    finished: Finished | None = None
    try:
        async for event in generate_text(target.engine, request, trace):
            if isinstance(event, Finished):
                # An engine error or abort is an error response, never a normal stop.
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
        _log_request(target, request, trace, finished, status, route)


def _request_metrics(target: Target, request: GenerationRequest) -> RequestMetrics | None:
    if target.metrics is None:
        return None
    return target.metrics.request(target.name or target.model_id, len(request.prompt_tokens))


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


# --- parsed output: reasoning, content and tool calls, for both protocols -------------

ParsedEvent = ContentDelta | ReasoningDelta | ToolCallStart | ToolCallArgumentsDelta | Finished


def model_settings_of(target: Target) -> ModelSettings | None:
    """The model's current settings (parser choices hot-reload, so not the load-time copy)."""
    name = target.name or target.model_id
    return next((m for m in target.settings.models if m.name == name), None)


def output_parser_for(
    target: Target, request: GenerationRequest, tools: Sequence[ToolSpec] | None
) -> OutputParser | None:
    """The parser chain for one request; `tools` is None when no tools were offered.

    Tool calls are parsed only when the model enables auto tool choice (like vLLM);
    otherwise a model's calls come back as plain content.
    """
    model = model_settings_of(target)
    if model is None:
        return None
    tool_parser = (
        model.tool_call_parser if model.enable_auto_tool_choice and tools is not None else None
    )
    if tool_parser is None and model.reasoning_parser is None:
        return None
    opens = False
    if model.reasoning_parser is not None:
        tail = target.engine.tokenizer.decode(request.prompt_tokens[-16:])
        opens = get_reasoning_parser(model.reasoning_parser).prompt_opens_reasoning(tail)
    return make_output_parser(tool_parser, model.reasoning_parser, tools, opens)


async def run_parsed(
    target: Target,
    request: GenerationRequest,
    route: str,
    parser: OutputParser | None,
    source: AsyncIterator[OutputEvent] | None = None,
) -> AsyncGenerator[ParsedEvent, None]:
    """`run` (or `source`, a wrapper of it) with the text split into reasoning, content
    and tool calls.

    The final Finished says TOOL_CALLS when the model stopped after calling tools.
    """
    called = False
    async for event in source or run(target, request, route):
        if isinstance(event, TextDelta):
            items = parser.feed(event.text) if parser else [ContentDelta(event.text)]
        else:
            items = parser.finish() if parser else []
        for item in items:
            if isinstance(item, ContentDelta | ReasoningDelta) and not item.text:
                continue
            called = called or isinstance(item, ToolCallStart)
            yield item
        if isinstance(event, Finished):
            if called and event.reason is FinishReason.STOP:
                event = replace(event, reason=FinishReason.TOOL_CALLS)
            yield event


async def coalesced(
    events: AsyncGenerator[ParsedEvent, None], interval: int
) -> AsyncGenerator[ParsedEvent, None]:
    """Join runs of text (or reasoning) deltas into one per `interval` tokens
    (engine.stream_interval); every other event passes at once."""
    pending: list[str] = []
    kind: type[ContentDelta] | type[ReasoningDelta] = ContentDelta
    async with aclosing(events):  # closing this closes the generation at once
        async for event in events:
            if isinstance(event, ContentDelta | ReasoningDelta):
                if pending and not isinstance(event, kind):
                    yield kind("".join(pending))
                    pending = []
                kind = type(event)
                pending.append(event.text)
                if len(pending) >= interval:
                    yield kind("".join(pending))
                    pending = []
                continue
            if pending:
                yield kind("".join(pending))
                pending = []
            yield event


async def limit_calls(
    events: AsyncIterator[ParsedEvent], max_calls: int | None
) -> AsyncIterator[ParsedEvent]:
    """Drop tool calls past the first ``max_calls`` (parallel tool calls turned off)."""
    async for event in events:
        if (
            max_calls is not None
            and isinstance(event, ToolCallStart | ToolCallArgumentsDelta)
            and event.index >= max_calls
        ):
            continue
        yield event
