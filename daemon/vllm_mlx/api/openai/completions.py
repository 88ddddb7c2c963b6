"""POST /v1/completions: text, `echo`, legacy `logprobs`, `n` choices, streamed or not.

`prompt` may hold several prompts (strings or token-id arrays): each gets `n` choices,
numbered prompt by prompt (choice `i * n + j` is prompt i's choice j), as OpenAI does.

`echo` with `logprobs` scores the prompt (its first token has no value), and with
`max_tokens: 0` that is all it does: lm-evaluation-harness's loglikelihood requests.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from litestar import Request, Response, post
from litestar.response import Stream

from vllm_mlx.api.edge.body import parse_body, server_state
from vllm_mlx.api.errors import APIError, bad_request, to_api_error
from vllm_mlx.api.openai import choices, convert
from vllm_mlx.api.openai.logprobs import LegacyLogprobs, Tap, merge_blocks, token_texts
from vllm_mlx.api.openai.schema import CompletionRequest
from vllm_mlx.api.pipeline import structured
from vllm_mlx.api.pipeline.offload import off_loop, prompt_tokens
from vllm_mlx.api.pipeline.turn import Target, build_request, new_request_id, resolve_target, run
from vllm_mlx.api.sse import DONE, SSE_HEADERS, data_event
from vllm_mlx.engine.output import OutputEvent
from vllm_mlx.engine.types import Finished, FinishReason, GenerationRequest, TextDelta, Usage

ROUTE = "/v1/completions"


@dataclass(frozen=True)
class _Prompt:
    """One prompt of the request: its tokens and the text `echo` repeats ("" without)."""

    tokens: list[int]
    echo: str


class _Choice:
    """One choice's text as it grows, with its legacy logprobs (offsets into that text)."""

    def __init__(
        self,
        events: AsyncIterator[OutputEvent],
        legacy: LegacyLogprobs | None,
        prompt: _Prompt,
    ) -> None:
        self.prompt = prompt
        self.tap = Tap(events)
        self.events = self.tap.events()
        self.legacy = legacy
        self.parts: list[str] = []
        self.blocks: list[dict[str, Any]] = []
        self.finished: Finished | None = None
        self.echoed = False

    def echo(self) -> tuple[str, dict[str, Any] | None]:
        """The echoed prompt, with its scores when the engine sent them."""
        self.echoed = True
        text, prompt = self.prompt.echo, self.prompt.tokens
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


async def _echo_text(target: Target, body: CompletionRequest, prompt: list[int], index: int) -> str:
    """Prompt `index` as sent; token ids are decoded (off the event loop)."""
    if not body.echo:
        return ""
    text = body.prompts()[index]
    if isinstance(text, str):
        return text
    limit = target.settings.limits.prompt_timeout
    decoded: str = await off_loop(target.engine.tokenizer.decode, prompt, limit_s=limit)
    return decoded


@post("/completions", status_code=200)
async def completions(request: Request[Any, Any, Any]) -> Response[Any]:
    body = await parse_body(request, CompletionRequest)
    target = await resolve_target(server_state(request), body.model)
    convert.refuse_unsupported(body)
    count = choices.choice_count(target, body.n, body.best_of)
    limit = target.settings.limits.max_prompts
    if len(body.prompts()) > limit:
        raise bad_request(f"at most {limit} prompts per request (limits.max_prompts)", "prompt")
    tokenizer = target.engine.tokenizer
    prompts = await prompt_tokens(target, convert.completion_prompt_tokens, tokenizer, body)
    request_id = new_request_id("cmpl")
    texts = token_texts(tokenizer) if body.logprobs is not None else None
    runs: list[_Choice] = []
    for index, tokens in enumerate(prompts):
        # Every prompt is its own engine request; ids stay unique across prompts.
        own_id = request_id if len(prompts) == 1 else f"{request_id}-p{index}"
        base = await _base_request(target, body, own_id, tokens)
        prompt = _Prompt(tokens, await _echo_text(target, body, tokens, index))
        runs += [
            _Choice(_events(target, gen), None if texts is None else LegacyLogprobs(texts), prompt)
            for gen in choices.fan_out(base, count)
        ]
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        job = _Job(request_id, body.model, target.settings.engine.stream_interval)
        return Stream(
            job.stream(runs, include_usage), media_type="text/event-stream", headers=SSE_HEADERS
        )
    return Response(await _complete(request_id, body.model, runs))


async def _base_request(
    target: Target, body: CompletionRequest, request_id: str, tokens: list[int]
) -> GenerationRequest:
    """One prompt's request, before its choices fan out."""
    base = build_request(
        target,
        request_id,
        tokens,
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
    return base


def _usage(runs: list[_Choice], usages: list[Usage]) -> Usage:
    """Each prompt's tokens once (its choices share one prefill), every completion's."""
    seen: set[int] = set()
    prompt_tokens_total = 0
    for run_, usage in zip(runs, usages, strict=True):
        if id(run_.prompt) not in seen:
            seen.add(id(run_.prompt))
            prompt_tokens_total += usage.prompt_tokens
    return Usage(prompt_tokens_total, sum(u.completion_tokens for u in usages))


def _events(target: Target, gen: GenerationRequest) -> AsyncIterator[OutputEvent]:
    if gen.max_tokens == 0 and gen.prompt_logprobs is None:
        return _no_generation(len(gen.prompt_tokens))
    return run(target, gen, ROUTE)


async def _complete(request_id: str, model: str, runs: list[_Choice]) -> dict[str, Any]:
    async with contextlib.aclosing(choices.merge([r.events for r in runs])) as merged:
        async for index, event in merged:
            run_ = runs[index]
            if not run_.echoed:
                text, block = run_.echo()
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
        chunk = convert.completion_chunk(request_id, model, text, reason, created, index, logprobs)
        out.extend(chunk["choices"])
    payload = convert.completion_chunk(request_id, model, "", None, created)
    payload["choices"] = out
    payload["usage"] = convert.usage_dict(_usage(runs, usages))
    return payload


class _Job:
    """The chunks of one streamed completion request (all choices)."""

    def __init__(self, request_id: str, model: str, interval: int) -> None:
        self.request_id, self.model, self.interval = request_id, model, interval
        self.created = int(time.time())

    def chunk(
        self, index: int, text: str, block: dict[str, Any] | None, reason: str | None = None
    ) -> bytes:
        payload = convert.completion_chunk(
            self.request_id, self.model, text, reason, self.created, index, block
        )
        return data_event(payload)

    async def stream(self, runs: list[_Choice], include_usage: bool) -> AsyncIterator[bytes]:
        usages: list[Usage] = [Usage(0, 0)] * len(runs)
        try:
            async with contextlib.aclosing(choices.merge([r.events for r in runs])) as merged:
                async for index, event in merged:
                    run_ = runs[index]
                    if not run_.echoed and run_.prompt.echo:
                        yield self.chunk(index, *run_.echo())
                    run_.echoed = True
                    if isinstance(event, TextDelta):
                        run_.parts.append(event.text)
                        if len(run_.parts) >= self.interval and "".join(run_.parts):
                            yield self.chunk(index, *run_.take())
                        continue
                    reason = convert.finish_reason(event.reason)
                    yield self.chunk(index, *run_.take(), reason)
                    usages[index] = event.usage
            if include_usage:
                usage_chunk = convert.completion_chunk(
                    self.request_id, self.model, "", None, self.created
                )
                usage_chunk["choices"] = []
                usage_chunk["usage"] = convert.usage_dict(_usage(runs, usages))
                yield data_event(usage_chunk)
        except Exception as exc:
            yield data_event(convert.error_body(to_api_error(exc)))
        yield DONE
