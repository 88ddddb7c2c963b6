"""POST /v1/completions: text, `echo`, legacy `logprobs`, `n` choices, streamed or not.

`echo` with `logprobs` scores the prompt (its first token has no value), and with
`max_tokens: 0` that is all it does: lm-evaluation-harness's loglikelihood requests.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

from litestar import Request, Response, post
from litestar.response import Stream

from vllm_mlx.api import structured
from vllm_mlx.api.common import parse_body, server_state
from vllm_mlx.api.errors import APIError, to_api_error
from vllm_mlx.api.generation import Target, build_request, new_request_id, resolve_target, run
from vllm_mlx.api.openai import choices, convert
from vllm_mlx.api.openai.logprobs import LegacyLogprobs, Tap, merge_blocks, token_texts
from vllm_mlx.api.openai.schema import CompletionRequest
from vllm_mlx.api.prepare import off_loop, prompt_tokens
from vllm_mlx.api.sse import DONE, SSE_HEADERS, data_event
from vllm_mlx.engine.output import OutputEvent
from vllm_mlx.engine.types import Finished, FinishReason, GenerationRequest, TextDelta, Usage

ROUTE = "/v1/completions"


class _Choice:
    """One choice's text as it grows, with its legacy logprobs (offsets into that text)."""

    def __init__(self, events: AsyncIterator[OutputEvent], legacy: LegacyLogprobs | None) -> None:
        self.tap = Tap(events)
        self.events = self.tap.events()
        self.legacy = legacy
        self.parts: list[str] = []
        self.blocks: list[dict[str, Any]] = []
        self.finished: Finished | None = None
        self.echoed = False

    def echo(self, text: str, prompt: list[int]) -> tuple[str, dict[str, Any] | None]:
        """The echoed prompt, with its scores when the engine sent them."""
        self.echoed = True
        if self.legacy is None:
            return text, None
        block = None
        if self.tap.prompt is not None:
            block = self.legacy.block(self.tap.prompt, prompt)
        self.legacy.offset = len(text)
        return text, block

    def take(self) -> tuple[str, dict[str, Any] | None]:
        """Text and logprobs gathered since the last call."""
        text, self.parts = "".join(self.parts), []
        entries = self.tap.take()
        block = self.legacy.block(entries) if self.legacy is not None else None
        return text, block


def _no_generation(prompt_tokens: int) -> AsyncIterator[OutputEvent]:
    """max_tokens 0 without scoring: the engine has nothing to do."""

    async def events() -> AsyncIterator[OutputEvent]:
        yield Finished(FinishReason.LENGTH, Usage(prompt_tokens, 0))

    return events()


async def _echo_text(target: Target, body: CompletionRequest, prompt: list[int]) -> str:
    """The prompt as sent; token ids are decoded (off the event loop)."""
    if not body.echo:
        return ""
    text = body.prompt[0] if isinstance(body.prompt, list) else body.prompt
    if isinstance(text, str):
        return text
    limit = target.settings.limits.prompt_timeout
    decoded: str = await off_loop(target.engine.tokenizer.decode, prompt, limit_s=limit)
    return decoded


@post("/completions", status_code=200)
async def completions(request: Request[Any, Any, Any]) -> Response[Any]:
    body = await parse_body(request, CompletionRequest)
    target = resolve_target(server_state(request), body.model)
    convert.refuse_unsupported(body)
    count = choices.choice_count(target, body.n, body.best_of)
    tokenizer = target.engine.tokenizer
    prompt = await prompt_tokens(target, convert.completion_prompt_tokens, tokenizer, body)
    base = build_request(
        target,
        new_request_id("cmpl"),
        prompt,
        body.max_tokens,
        convert.sampling_from(target, body),
        body.stop_tuple(),
        timeout=body.timeout,
    )
    base.logprobs = body.logprobs
    base.logprobs_raw = body.logprobs_mode == "raw_logprobs"
    if body.echo and body.logprobs is not None:
        base.prompt_logprobs = body.logprobs
    constraint = convert.output_constraint(body)
    if constraint is not None:  # every choice shares it: each gets its own matcher
        await structured.constrain(target, base, constraint)
    texts = token_texts(tokenizer) if body.logprobs is not None else None
    runs = [
        _Choice(_events(target, gen), None if texts is None else LegacyLogprobs(texts))
        for gen in choices.fan_out(base, count)
    ]
    echo = await _echo_text(target, body, prompt)
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        job = _Job(
            base.request_id, body.model, prompt, echo, target.settings.engine.stream_interval
        )
        return Stream(
            job.stream(runs, include_usage), media_type="text/event-stream", headers=SSE_HEADERS
        )
    return Response(await _complete(base, body.model, runs, echo))


def _events(target: Target, gen: GenerationRequest) -> AsyncIterator[OutputEvent]:
    if gen.max_tokens == 0 and gen.prompt_logprobs is None:
        return _no_generation(len(gen.prompt_tokens))
    return run(target, gen, ROUTE)


async def _complete(
    base: GenerationRequest, model: str, runs: list[_Choice], echo: str
) -> dict[str, Any]:
    async with contextlib.aclosing(choices.merge([r.events for r in runs])) as merged:
        async for index, event in merged:
            run_ = runs[index]
            if not run_.echoed:
                text, block = run_.echo(echo, base.prompt_tokens)
                run_.parts.append(text)
                if block is not None:
                    run_.blocks.append(block)
            if isinstance(event, TextDelta):
                run_.parts.append(event.text)
            else:
                run_.finished = event
    out, usages = [], []
    created = int(time.time())
    for index, run_ in enumerate(runs):
        if run_.finished is None:
            raise APIError(500, "generation ended without a result", "server_error")
        usages.append(run_.finished.usage)
        text, block = run_.take()
        logprobs = None if block is None else merge_blocks([*run_.blocks, block])
        reason = convert.finish_reason(run_.finished.reason)
        chunk = convert.completion_chunk(
            base.request_id, model, text, reason, created, index, logprobs
        )
        out.extend(chunk["choices"])
    payload = convert.completion_chunk(base.request_id, model, "", None, created)
    payload["choices"] = out
    payload["usage"] = convert.usage_dict(choices.total_usage(usages))
    return payload


class _Job:
    """The chunks of one streamed completion request (all choices)."""

    def __init__(
        self, request_id: str, model: str, prompt: list[int], echo: str, interval: int
    ) -> None:
        self.request_id, self.model, self.prompt = request_id, model, prompt
        self.echo_text, self.interval = echo, interval
        self.created = int(time.time())

    def chunk(
        self, index: int, text: str, block: dict[str, Any] | None, reason: str | None = None
    ) -> bytes:
        payload = convert.completion_chunk(
            self.request_id, self.model, text, reason, self.created, index, block
        )
        return data_event(payload)

    async def stream(self, runs: list[_Choice], include_usage: bool) -> AsyncIterator[bytes]:
        usages = []
        try:
            async with contextlib.aclosing(choices.merge([r.events for r in runs])) as merged:
                async for index, event in merged:
                    run_ = runs[index]
                    if not run_.echoed and self.echo_text:
                        yield self.chunk(index, *run_.echo(self.echo_text, self.prompt))
                    run_.echoed = True
                    if isinstance(event, TextDelta):
                        run_.parts.append(event.text)
                        if len(run_.parts) >= self.interval and "".join(run_.parts):
                            yield self.chunk(index, *run_.take())
                        continue
                    reason = convert.finish_reason(event.reason)
                    yield self.chunk(index, *run_.take(), reason)
                    usages.append(event.usage)
            if include_usage:
                usage_chunk = convert.completion_chunk(
                    self.request_id, self.model, "", None, self.created
                )
                usage_chunk["choices"] = []
                usage_chunk["usage"] = convert.usage_dict(choices.total_usage(usages))
                yield data_event(usage_chunk)
        except Exception as exc:
            yield data_event(convert.error_body(to_api_error(exc)))
        yield DONE
