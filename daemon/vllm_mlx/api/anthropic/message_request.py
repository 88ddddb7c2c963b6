"""A Messages body -> its generation: the prompt, the request, the parsers, the builder.

Shared by the route and the MCP loop (every tool round).
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm_mlx.api.anthropic import convert
from vllm_mlx.api.anthropic.builder import MessageBuilder
from vllm_mlx.api.anthropic.schema import MessagesRequest
from vllm_mlx.api.pipeline import structured
from vllm_mlx.api.pipeline.driver import Run, limit_calls, parsed
from vllm_mlx.api.pipeline.ids import new_id
from vllm_mlx.api.pipeline.turn import RequestPlan, Turn, requested_speculation
from vllm_mlx.api.pipeline.vision import ImageParts


@dataclass(frozen=True)
class MessageGeneration:
    run: Run  # reasoning, text and tool calls as the request's parsers split them
    builder: MessageBuilder


async def message_generation(turn: Turn, body: MessagesRequest) -> MessageGeneration:
    images = ImageParts.of(turn)
    volatile = turn.settings.engine.prompt_canonicalization
    prompt_fields = convert.build_prompt(body, volatile, images)
    prompt = await convert.turn_prompt(turn, images, prompt_fields)
    sampling = turn.sampling(temperature=body.temperature, top_p=body.top_p, top_k=body.top_k)
    max_tokens = turn.allowed_tokens(prompt, body.max_tokens)
    # The output's constraint; forced tool use gets its own call reader.
    forced = convert.forced_tools(body, prompt_fields) if structured.enabled(turn) else None
    constraint = await structured.request_constraint(
        turn, prompt, convert.output_constraint(body), forced
    )
    plan = RequestPlan(
        max_tokens,
        sampling,
        body.stop_tuple(),
        constraint=constraint,
        speculative=requested_speculation(body.speculative),
    )
    gen = turn.request(new_id("msg_"), prompt, plan)
    parser = structured.output_parser(turn, prompt, forced, prompt_fields.tool_specs or None)
    # disable_parallel_tool_use: the first call only
    run = limit_calls(parsed(turn, gen, parser), prompt_fields.max_tool_calls)
    return MessageGeneration(run, MessageBuilder(gen.request_id, body.model, len(prompt.tokens)))
