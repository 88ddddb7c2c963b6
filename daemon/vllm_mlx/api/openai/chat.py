"""POST /v1/chat/completions: content, reasoning and tool calls, streamed or not."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from litestar import Request, Response, post
from litestar.response import Stream

from vllm_mlx.api.edge.body import parse_body, server_state
from vllm_mlx.api.errors import APIError, to_api_error
from vllm_mlx.api.openai import choices, convert
from vllm_mlx.api.openai import mcp_loop as mcp_chat
from vllm_mlx.api.openai.logprobs import Tap, TokenTexts, chat_logprobs, token_texts
from vllm_mlx.api.openai.schema import ChatCompletionRequest
from vllm_mlx.api.pipeline import structured
from vllm_mlx.api.pipeline.offload import prompt_tokens
from vllm_mlx.api.pipeline.structured import ForcedTools
from vllm_mlx.api.pipeline.turn import (
    ParsedEvent,
    Target,
    build_request,
    limit_calls,
    new_request_id,
    resolve_target,
    run,
    run_parsed,
)
from vllm_mlx.api.sse import DONE, SSE_HEADERS, data_event
from vllm_mlx.engine.types import Finished, GenerationRequest, TokenLogprob
from vllm_mlx.parsers.pipeline import OutputParser
from vllm_mlx.parsers.types import (
    ContentDelta,
    ReasoningDelta,
    ToolCall,
    ToolCallArgumentsDelta,
    ToolCallStart,
    ToolSpec,
)

ROUTE = "/v1/chat/completions"


@post("/chat/completions", status_code=200)
async def chat_completions(request: Request[Any, Any, Any]) -> Response[Any]:
    body = await parse_body(request, ChatCompletionRequest)
    state = server_state(request)
    target = await resolve_target(state, body.model)
    convert.refuse_unsupported(body)
    # mcp_tools (per model): MCP tools join the offer; `execute` runs them here.
    body, mcp_loop = mcp_chat.attach(state.mcp, target, body)
    if mcp_loop is not None:
        return await mcp_loop.respond(body, _prepare, _complete_one)
    count = choices.choice_count(target, body.n)
    base, forced = await _base_request(target, body)
    texts = token_texts(target.engine.tokenizer) if body.logprobs else None
    max_calls = _max_calls(body)
    runs = [
        _Choice(target, gen, _parser(target, gen, body, forced), max_calls, texts)
        for gen in choices.fan_out(base, count)
    ]
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        interval = target.settings.engine.stream_interval
        return Stream(
            _stream(base.request_id, body.model, runs, include_usage, interval),
            media_type="text/event-stream",
            headers=SSE_HEADERS,
        )
    return Response(await _complete(base.request_id, body.model, runs))


async def _base_request(
    target: Target, body: ChatCompletionRequest
) -> tuple[GenerationRequest, ForcedTools | None]:
    kwargs = convert.template_kwargs(body, target.settings.server.allow_client_chat_templates)
    prompt = await prompt_tokens(
        target, convert.chat_prompt_tokens, target.engine.tokenizer, body, kwargs
    )
    base = build_request(
        target,
        new_request_id("chatcmpl"),
        prompt,
        body.wanted_max_tokens(),
        convert.sampling_from(target, body),
        body.stop_tuple(),
        timeout=body.timeout,
    )
    base.logprobs = (body.top_logprobs or 0) if body.logprobs else None
    base.logprobs_raw = body.logprobs_mode == "raw_logprobs"
    return base, await _structured(target, base, body)


def _tools(body: ChatCompletionRequest) -> list[ToolSpec] | None:
    return convert.tool_specs(convert.offered_tools(body))


def _max_calls(body: ChatCompletionRequest) -> int | None:
    return 1 if body.parallel_tool_calls is False else None  # keep the first call only


async def _prepare(
    target: Target, body: ChatCompletionRequest
) -> tuple[GenerationRequest, OutputParser | None, int | None]:
    """One generation (a round of the MCP loop): the request, its parser, its call limit."""
    gen, forced = await _base_request(target, body)
    return gen, _parser(target, gen, body, forced), _max_calls(body)


async def _complete_one(
    target: Target,
    gen: GenerationRequest,
    model: str,
    parser: OutputParser | None,
    max_calls: int | None,
) -> dict[str, Any]:
    return await _complete(gen.request_id, model, [_Choice(target, gen, parser, max_calls, None)])


class _Choice:
    """One choice's parsed events, with its token logprobs kept beside them."""

    def __init__(
        self,
        target: Target,
        gen: GenerationRequest,
        parser: OutputParser | None,
        max_calls: int | None,
        texts: TokenTexts | None,
    ) -> None:
        self.tap = Tap(run(target, gen, ROUTE))
        parsed = run_parsed(target, gen, ROUTE, parser, self.tap.events())
        self.events = limit_calls(parsed, max_calls)
        self.texts = texts
        self.entries: list[TokenLogprob] = []  # everything taken so far (non-streamed)

    def logprobs(self) -> dict[str, Any] | None:
        """The logprobs that arrived since the last call (None when not asked)."""
        if self.texts is None:
            return None
        taken = self.tap.take()
        self.entries.extend(taken)
        return chat_logprobs(self.texts, taken)


async def _structured(
    target: Target, base: GenerationRequest, body: ChatCompletionRequest
) -> ForcedTools | None:
    """Attach the output's constraint (every choice shares it; each gets its own matcher);
    a forced tool choice is returned, as its calls need their own reader."""
    forced = convert.forced_tools(body) if structured.enabled(target) else None
    await structured.attach(
        target, base, convert.output_constraint(body), forced, "an output format"
    )
    return forced


def _parser(
    target: Target, gen: GenerationRequest, body: ChatCompletionRequest, forced: ForcedTools | None
) -> OutputParser | None:
    return structured.output_parser(target, gen, forced, _tools(body))


class _Message:
    def __init__(self) -> None:
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.calls: dict[int, list[str]] = {}  # index -> [id, name, arguments...]
        self.finished: Finished | None = None

    def add(self, event: ParsedEvent) -> None:
        if isinstance(event, ContentDelta):
            self.content.append(event.text)
        elif isinstance(event, ReasoningDelta):
            self.reasoning.append(event.text)
        elif isinstance(event, ToolCallStart):
            self.calls[event.index] = [event.id, event.name]
        elif isinstance(event, ToolCallArgumentsDelta):
            self.calls[event.index].append(event.fragment)
        else:
            self.finished = event

    def message(self) -> dict[str, Any]:
        calls = [ToolCall(c[0], c[1], "".join(c[2:]) or "{}") for c in self.calls.values()]
        return convert.chat_message("".join(self.content), "".join(self.reasoning), calls)


async def _complete(request_id: str, model: str, runs: list[_Choice]) -> dict[str, Any]:
    messages = [_Message() for _ in runs]
    async with contextlib.aclosing(choices.merge([r.events for r in runs])) as merged:
        async for index, event in merged:
            messages[index].add(event)
    out, usages = [], []
    for index, (run_, message) in enumerate(zip(runs, messages, strict=True)):
        if message.finished is None:
            raise APIError(500, "generation ended without a result", "server_error")
        usages.append(message.finished.usage)
        reason = convert.finish_reason(message.finished.reason)
        run_.logprobs()
        logprobs = None if run_.texts is None else chat_logprobs(run_.texts, run_.entries)
        out.append(convert.chat_choice(index, message.message(), reason, logprobs))
    return convert.chat_response(request_id, model, out, choices.total_usage(usages))


async def _stream(
    request_id: str, model: str, runs: list[_Choice], include_usage: bool, interval: int
) -> AsyncIterator[bytes]:
    chunks = convert.ChatChunks(request_id, model)
    for index in range(len(runs)):
        yield data_event(chunks.chunk({"role": "assistant", "content": ""}, index=index))
    # Content is batched by stream_interval per choice; everything else goes at once.
    pending: list[list[str]] = [[] for _ in runs]
    usages = []
    try:
        async with contextlib.aclosing(choices.merge([r.events for r in runs])) as merged:
            async for index, event in merged:
                run_, waiting = runs[index], pending[index]
                if isinstance(event, ContentDelta):
                    waiting.append(event.text)
                    if len(waiting) >= interval:
                        delta = {"content": "".join(waiting)}
                        yield data_event(chunks.chunk(delta, None, index, run_.logprobs()))
                        waiting.clear()
                    continue
                if waiting:
                    delta = {"content": "".join(waiting)}
                    yield data_event(chunks.chunk(delta, None, index, run_.logprobs()))
                    waiting.clear()
                if isinstance(event, Finished):
                    reason = convert.finish_reason(event.reason)
                    yield data_event(chunks.chunk({}, reason, index, run_.logprobs()))
                    usages.append(event.usage)
                else:
                    yield data_event(chunks.chunk(_delta(event), None, index, run_.logprobs()))
        if include_usage:
            yield data_event(chunks.usage(choices.total_usage(usages)))
    except Exception as exc:  # headers are sent: the error travels as an event
        yield data_event(convert.error_body(to_api_error(exc)))
    yield DONE


def _delta(event: ReasoningDelta | ToolCallStart | ToolCallArgumentsDelta) -> dict[str, Any]:
    if isinstance(event, ReasoningDelta):
        return convert.reasoning_delta(event.text)
    if isinstance(event, ToolCallStart):
        return convert.tool_start_delta(event.index, event.id, event.name)
    return convert.tool_arguments_delta(event.index, event.fragment)
