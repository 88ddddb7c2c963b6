"""POST /tokenize and POST /detokenize, as vLLM serves them (outside /v1, same keys).

A `messages` body is rendered exactly as /v1/chat/completions renders it, so `count`
equals that request's `usage.prompt_tokens`; a `prompt` body is encoded as
/v1/completions encodes it. The work runs in the prompt worker pool, off the event
loop, under limits.prompt_timeout; client chat templates need
server.allow_client_chat_templates, as on the chat route.
"""

from __future__ import annotations

from typing import Any

from litestar import Request, Router, post

from vllm_mlx.api.edge.body import parse_body
from vllm_mlx.api.error_shapes import openai_error_response
from vllm_mlx.api.errors import bad_request
from vllm_mlx.api.openai import convert
from vllm_mlx.api.openai.schema import ChatCompletionRequest, DetokenizeRequest, TokenizeRequest
from vllm_mlx.api.pipeline.chat_template import as_token_list, render_chat
from vllm_mlx.api.pipeline.turn import Turn, resolve_turn
from vllm_mlx.api.pipeline.vision import ImageParts, chat_prompt
from vllm_mlx.api.state import request_settings


def _model_id(request: Request[Any, Any, Any], model: str | None) -> str:
    """vLLM makes `model` optional: the first served model then."""
    if model is not None:
        return model
    models = request_settings(request).models
    if not models:
        raise bad_request("no model is served", "model")
    return models[0].name


def _chat_request(body: TokenizeRequest) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {
            "model": body.model or "-",
            "messages": body.messages,
            "tools": body.tools,
            "chat_template_kwargs": body.chat_template_kwargs,
        }
    )


def _chat_tokens(
    tokenizer: Any,
    chat: ChatCompletionRequest,
    body: TokenizeRequest,
    kwargs: dict[str, Any],
    messages: list[dict[str, Any]],
) -> list[int]:
    """As /v1/chat/completions renders them (volatile system lines left out too),
    unless the body asks otherwise."""
    if body.continue_final_message:
        return render_chat(
            tokenizer,
            messages,
            convert.template_tools(chat),
            kwargs,
            continue_final_message=True,
        )
    if body.add_generation_prompt is not False:
        return render_chat(tokenizer, messages, convert.template_tools(chat), kwargs)
    try:
        tokens = tokenizer.apply_chat_template(
            messages,
            tools=convert.template_tools(chat),
            add_generation_prompt=False,
            tokenize=True,
            **kwargs,
        )
    except Exception as exc:
        raise bad_request(f"the chat template rejected the messages: {exc}", "messages") from exc
    return as_token_list(tokens)


async def _image_chat_tokens(
    turn: Turn,
    images: ImageParts,
    chat: ChatCompletionRequest,
    body: TokenizeRequest,
    kwargs: dict[str, Any],
    messages: list[dict[str, Any]],
) -> list[int]:
    """A vision model's prompt as the chat route builds it (images fetched, decoded and
    tiled), each image token shown as the model's image token id: `count` is then the
    chat request's `usage.prompt_tokens`."""
    if body.add_generation_prompt is False:
        raise bad_request(
            "add_generation_prompt: false is not available for messages with images",
            "add_generation_prompt",
        )
    tools = convert.template_tools(chat)
    continued = bool(body.continue_final_message)
    prompt = await chat_prompt(
        turn, images, messages, tools, kwargs, continue_final_message=continued
    )
    tower = images.tower
    assert tower is not None  # ImageParts refuses images on a text model
    return [tower.image_token_id if t >= tower.vocab_size else t for t in prompt.tokens]


def _prompt_tokens(tokenizer: Any, body: TokenizeRequest) -> list[int]:
    special = body.add_special_tokens is not False
    return as_token_list(tokenizer.encode(body.prompt or "", add_special_tokens=special))


@post("/tokenize", status_code=200)
async def tokenize(request: Request[Any, Any, Any]) -> dict[str, Any]:
    body = await parse_body(request, TokenizeRequest)
    turn = await resolve_turn(request, _model_id(request, body.model), "/tokenize")
    tokenizer = turn.tokenizer
    if body.messages is not None:
        chat = _chat_request(body)
        allow = turn.settings.server.allow_client_chat_templates
        kwargs = convert.template_kwargs(chat, allow)
        volatile = turn.settings.engine.prompt_canonicalization
        images = ImageParts.of(turn)
        messages = await turn.off_loop(convert.template_messages, chat, volatile, images)
        if images.refs:
            tokens = await _image_chat_tokens(turn, images, chat, body, kwargs, messages)
        else:
            tokens = await turn.off_loop(_chat_tokens, tokenizer, chat, body, kwargs, messages)
    else:
        tokens = await turn.off_loop(_prompt_tokens, tokenizer, body)
    strs = tokenizer.convert_ids_to_tokens(tokens) if body.return_token_strs else None
    return {
        "count": len(tokens),
        "max_model_len": turn.engine.context_length,
        "tokens": tokens,
        "token_strs": strs,
    }


@post("/detokenize", status_code=200)
async def detokenize(request: Request[Any, Any, Any]) -> dict[str, Any]:
    body = await parse_body(request, DetokenizeRequest)
    turn = await resolve_turn(request, _model_id(request, body.model), "/detokenize")
    tokenizer = turn.tokenizer
    vocab_size = len(tokenizer.get_vocab())
    if any(t < 0 or t >= vocab_size for t in body.tokens):
        raise bad_request("tokens contains ids outside the vocabulary", "tokens")
    text = await turn.off_loop(tokenizer.decode, body.tokens)
    return {"prompt": text}


def make_tokenize_router() -> Router:
    return Router(
        path="/",
        route_handlers=[tokenize, detokenize],
        exception_handlers={Exception: openai_error_response},
    )
