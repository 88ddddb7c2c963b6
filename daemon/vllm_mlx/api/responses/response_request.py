"""A Responses body -> its one generation and the builder of its response.

The stored conversation (previous_response_id) comes first, then this request's input
items; with `store`, the response and its conversation are kept once it is over.
"""

from __future__ import annotations

from typing import Any

from litestar import Request

from vllm_mlx.api.pipeline import driver, structured
from vllm_mlx.api.pipeline.chat_template import as_token_list
from vllm_mlx.api.pipeline.driver import Run
from vllm_mlx.api.pipeline.ids import new_id
from vllm_mlx.api.pipeline.turn import RequestPlan, requested_speculation, resolve_turn
from vllm_mlx.api.pipeline.vision import ImageParts, chat_prompt
from vllm_mlx.api.responses import convert, tools
from vllm_mlx.api.responses.builder import ResponseBuilder, response_base
from vllm_mlx.api.responses.schema import CreateResponseRequest
from vllm_mlx.api.state import ServerState, server_state
from vllm_mlx.config.settings import Settings

ROUTE = "/v1/responses"


def _history(
    state: ServerState, settings: Settings, body: CreateResponseRequest
) -> list[dict[str, Any]]:
    if body.previous_response_id is None:
        return []
    limits = settings.responses
    stored = state.responses.get(
        body.previous_response_id, max_entries=limits.store_max_entries, ttl=limits.store_ttl
    )
    if stored is None:
        raise convert.previous_not_found(body.previous_response_id)
    return stored.conversation


async def response_generation(
    request: Request[Any, Any, Any], body: CreateResponseRequest
) -> tuple[Run, ResponseBuilder]:
    """The request's one generation and the builder of its response."""
    turn = await resolve_turn(request, body.model, ROUTE)
    state = server_state(request)
    convert.check_unsupported(body)
    images = ImageParts.of(turn)
    items = convert.input_items(body, images.tower is not None)
    history = _history(state, turn.settings, body)
    toolset = tools.tool_set(body)
    offered = tools.offered(toolset, body.tool_choice)
    volatile = turn.settings.engine.prompt_canonicalization
    everything = [*history, *items]
    messages = convert.chat_messages(everything, body.instructions, len(history), volatile, images)
    # Agent prompts run to thousands of tokens: rendered off the event loop, time-bounded.
    kwargs = convert.template_kwargs(body)
    prompt = await chat_prompt(turn, images, messages, offered.template or None, kwargs)
    tokenizer = turn.tokenizer
    sampling = turn.sampling(temperature=body.temperature, top_p=body.top_p)
    max_tokens = turn.allowed_tokens(prompt, body.max_output_tokens)
    request_id = new_id("resp_", 32)
    tools.warn_left_out(toolset, request_id)
    # text.format's constraint; a forced tool choice gets its own call reader.
    forced = tools.forced(body, toolset, offered) if structured.enabled(turn) else None
    constraint = await structured.request_constraint(
        turn, prompt, convert.output_constraint(body), forced
    )
    plan = RequestPlan(
        max_tokens,
        sampling,
        constraint=constraint,
        speculative=requested_speculation(body.speculative),
    )
    gen = turn.request(request_id, prompt, plan)
    parser = structured.output_parser(turn, prompt, forced, offered.specs or None)

    def count_tokens(text: str) -> int:
        return len(as_token_list(tokenizer.encode(text))) if text else 0

    def keep(response: dict[str, Any]) -> None:
        if not body.stores:
            return
        limits = turn.settings.responses
        state.responses.put(
            response,
            items,
            [*history, *items],
            max_entries=limits.store_max_entries,
            ttl=limits.store_ttl,
        )

    builder = ResponseBuilder(
        response_base(body, request_id, sampling),
        offered.namespaces,
        count_tokens,
        max_calls=1 if body.parallel_tool_calls is False else None,
        keep=keep,
    )
    return driver.parsed(turn, gen, parser), builder
