"""A chat completion body -> its generation: the prompt, the request, the parsers.

Shared by the route (every choice of a request) and the MCP loop (every tool round).
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm_mlx.api.openai import choices, convert
from vllm_mlx.api.openai.chat_builder import ChoiceLogprobs
from vllm_mlx.api.openai.logprobs import Tap, token_texts
from vllm_mlx.api.openai.prediction import prediction_text
from vllm_mlx.api.openai.schema import ChatCompletionRequest
from vllm_mlx.api.pipeline import structured
from vllm_mlx.api.pipeline.driver import Run, limit_calls, parsed
from vllm_mlx.api.pipeline.observe import run
from vllm_mlx.api.pipeline.structured import ForcedTools
from vllm_mlx.api.pipeline.turn import Prompt, RequestPlan, Turn, requested_speculation
from vllm_mlx.api.pipeline.vision import ImageParts, chat_prompt
from vllm_mlx.engine.types import GenerationRequest
from vllm_mlx.parsers.types import ToolSpec


@dataclass(frozen=True)
class ChatGeneration:
    """One generation of a chat body, before its choices fan out."""

    turn: Turn
    base: GenerationRequest
    prompt: Prompt
    forced: ForcedTools | None
    tools: list[ToolSpec] | None
    max_calls: int | None  # parallel_tool_calls false: the first call only

    def runs(self, count: int, logprobs: bool) -> tuple[list[Run], list[ChoiceLogprobs | None]]:
        """`count` choices: each its own engine request (one shared prefill) and parser."""
        texts = token_texts(self.turn.tokenizer) if logprobs else None
        runs: list[Run] = []
        taps: list[ChoiceLogprobs | None] = []
        for gen in choices.fan_out(self.base, count):
            tap = Tap(run(self.turn, gen))
            parser = structured.output_parser(self.turn, self.prompt, self.forced, self.tools)
            runs.append(limit_calls(parsed(self.turn, gen, parser, tap.events()), self.max_calls))
            taps.append(None if texts is None else ChoiceLogprobs(tap, texts))
        return runs, taps


async def predicted_tokens(turn: Turn, body: ChatCompletionRequest) -> tuple[int, ...]:
    """The prediction's text as token ids (no special tokens), off the event loop."""
    text = prediction_text(body.prediction)
    if not text:
        return ()

    def encode() -> list[int]:
        return list(turn.tokenizer.encode(text, add_special_tokens=False))

    return tuple(await turn.off_loop(encode))


async def chat_generation(
    turn: Turn, body: ChatCompletionRequest, request_id: str
) -> ChatGeneration:
    kwargs = convert.template_kwargs(body, turn.settings.server.allow_client_chat_templates)
    volatile = turn.settings.engine.prompt_canonicalization
    images = ImageParts.of(turn)
    messages = await turn.off_loop(convert.template_messages, body, volatile, images)
    prompt = await chat_prompt(turn, images, messages, convert.template_tools(body), kwargs)
    sampling = convert.sampling_from(turn, body)
    max_tokens = turn.allowed_tokens(prompt, body.wanted_max_tokens())
    # Every choice shares the constraint; each gets its own matcher.
    forced = convert.forced_tools(body) if structured.enabled(turn) else None
    constraint = await structured.request_constraint(
        turn, prompt, convert.output_constraint(body), forced
    )
    plan = RequestPlan(
        max_tokens,
        sampling,
        body.stop_tuple(),
        body.timeout,
        constraint,
        logprobs=(body.top_logprobs or 0) if body.logprobs else None,
        logprobs_raw=body.logprobs_mode == "raw_logprobs",
        speculative=requested_speculation(body.speculative),
        prediction=await predicted_tokens(turn, body),
        ignore_eos=bool(body.ignore_eos),
    )
    tools = convert.tool_specs(convert.offered_tools(body))
    max_calls = 1 if body.parallel_tool_calls is False else None
    base = turn.request(request_id, prompt, plan)
    return ChatGeneration(turn, base, prompt, forced, tools, max_calls)
