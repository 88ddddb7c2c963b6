"""POST /v1/completions: text, `echo`, legacy `logprobs`, `n` choices, streamed or not.

`prompt` may hold several prompts (strings or token-id arrays): each gets `n` choices,
numbered prompt by prompt (choice `i * n + j` is prompt i's choice j), as OpenAI does.

`echo` with `logprobs` scores the prompt (its first token has no value), and with
`max_tokens: 0` that is all it does: lm-evaluation-harness's loglikelihood requests.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from litestar import Request, Response, post
from litestar.response import Stream

from vllm_mlx.api.edge.body import parse_body
from vllm_mlx.api.errors import bad_request
from vllm_mlx.api.openai import choices, convert
from vllm_mlx.api.openai.completion_builder import (
    CompletionBuilder,
    CompletionChoice,
    CompletionPrompt,
)
from vllm_mlx.api.openai.logprobs import LegacyLogprobs, Tap, token_texts
from vllm_mlx.api.openai.schema import CompletionRequest
from vllm_mlx.api.pipeline import driver, structured
from vllm_mlx.api.pipeline.driver import Run
from vllm_mlx.api.pipeline.ids import new_id
from vllm_mlx.api.pipeline.observe import run
from vllm_mlx.api.pipeline.turn import (
    Prompt,
    RequestPlan,
    Turn,
    requested_speculation,
    resolve_turn,
)
from vllm_mlx.api.sse import SSE_HEADERS
from vllm_mlx.engine.output import OutputEvent
from vllm_mlx.engine.types import Finished, FinishReason, GenerationRequest, Usage

ROUTE = "/v1/completions"


async def _no_generation(prompt_tokens: int) -> AsyncIterator[OutputEvent]:
    """max_tokens 0 without scoring: the engine has nothing to do."""
    yield Finished(FinishReason.LENGTH, Usage(prompt_tokens, 0))


def _events(turn: Turn, gen: GenerationRequest) -> AsyncIterator[OutputEvent]:
    if gen.max_tokens == 0 and gen.prompt_logprobs is None:
        return _no_generation(len(gen.prompt_tokens))
    return run(turn, gen)


async def _echo_text(turn: Turn, body: CompletionRequest, prompt: list[int], index: int) -> str:
    """Prompt `index` as sent; token ids are decoded (off the event loop)."""
    if not body.echo:
        return ""
    text = body.prompts()[index]
    if isinstance(text, str):
        return text
    return await turn.off_loop(turn.tokenizer.decode, prompt)


async def _base_request(
    turn: Turn, body: CompletionRequest, request_id: str, prompt: Prompt
) -> GenerationRequest:
    """One prompt's request, before its choices fan out."""
    sampling = convert.sampling_from(turn, body)
    max_tokens = turn.allowed_tokens(prompt, body.max_tokens)
    constraint = convert.output_constraint(body)
    plan = RequestPlan(
        max_tokens,
        sampling,
        body.stop_tuple(),
        body.timeout,
        # Every choice shares the constraint: each gets its own matcher.
        None if constraint is None else await structured.bound(turn, prompt, constraint),
        logprobs=body.logprobs,
        logprobs_raw=body.logprobs_mode == "raw_logprobs",
        prompt_logprobs=body.logprobs if body.echo and body.logprobs is not None else None,
        speculative=requested_speculation(body.speculative),
        ignore_eos=bool(body.ignore_eos),
    )
    return turn.request(request_id, prompt, plan)


@post("/completions", status_code=200)
async def completions(request: Request[Any, Any, Any]) -> Response[Any]:
    body = await parse_body(request, CompletionRequest)
    turn = await resolve_turn(request, body.model, ROUTE)
    convert.refuse_unsupported(body)
    count = choices.choice_count(turn, body.n, body.best_of)
    limit = turn.settings.limits.max_prompts
    if len(body.prompts()) > limit:
        raise bad_request(f"at most {limit} prompts per request (limits.max_prompts)", "prompt")
    tokenizer = turn.tokenizer
    prompts = await turn.off_loop(convert.completion_prompt_tokens, tokenizer, body)
    request_id = new_id("cmpl-")
    texts = token_texts(tokenizer) if body.logprobs is not None else None
    runs: list[Run] = []
    picks: list[CompletionChoice] = []
    for index, tokens in enumerate(prompts):
        # Every prompt is its own engine request; ids stay unique across prompts.
        own_id = request_id if len(prompts) == 1 else f"{request_id}-p{index}"
        base = await _base_request(turn, body, own_id, turn.prompt_of(tokens))
        prompt = CompletionPrompt(tokens, await _echo_text(turn, body, tokens, index))
        for gen in choices.fan_out(base, count):
            tap = Tap(_events(turn, gen))
            legacy = None if texts is None else LegacyLogprobs(texts)
            picks.append(CompletionChoice(prompt, tap, legacy))
            runs.append(driver.parsed(turn, gen, None, tap.events()))
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    builder = CompletionBuilder(
        request_id, body.model, picks, streaming=bool(body.stream), include_usage=include_usage
    )
    if body.stream:
        frames = driver.stream(runs, builder, turn.settings.engine.stream_interval)
        return Stream(frames, media_type="text/event-stream", headers=SSE_HEADERS)
    return Response(await driver.complete(runs, builder))
