"""OpenAI wire <-> neutral engine records."""

from __future__ import annotations

import json
import time
from typing import Any

from vllm_mlx.api.chat_template import as_token_list, render_chat
from vllm_mlx.api.errors import APIError, bad_request
from vllm_mlx.api.openai.schema import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    ErrorResponse,
    ImagePart,
    UsageDict,
)
from vllm_mlx.engine.types import FinishReason, Usage

OPENAI_ERROR_TYPES = {
    "invalid_request": "invalid_request_error",
    "not_found": "invalid_request_error",
    "authentication": "authentication_error",
    "rate_limit": "rate_limit_error",
    "timeout": "timeout_error",
    "unavailable": "service_unavailable_error",
    "server_error": "server_error",
}


def error_body(error: APIError) -> ErrorResponse:
    return {
        "error": {
            "message": error.message,
            "type": OPENAI_ERROR_TYPES.get(error.kind, "server_error"),
            "param": error.param,
            "code": error.code,
        }
    }


def _message_text(message: ChatMessage, index: int) -> str | None:
    if message.content is None or isinstance(message.content, str):
        return message.content
    parts = []
    for part in message.content:
        if isinstance(part, ImagePart):
            raise bad_request(
                "model does not accept images", f"messages[{index}].content", "unsupported_content"
            )
        parts.append(part.text)
    return "".join(parts)


def template_messages(request: ChatCompletionRequest) -> list[dict[str, Any]]:
    """Messages as chat templates expect them (HF conventions, tool calls as objects)."""
    out: list[dict[str, Any]] = []
    for index, message in enumerate(request.messages):
        role = "system" if message.role == "developer" else message.role
        item: dict[str, Any] = {"role": role, "content": _message_text(message, index) or ""}
        if message.name:
            item["name"] = message.name
        if message.tool_calls:
            item["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {
                        "name": call.function.name,
                        "arguments": _json_or_text(call.function.arguments),
                    },
                }
                for call in message.tool_calls
            ]
        if message.tool_call_id:
            item["tool_call_id"] = message.tool_call_id
        out.append(item)
    return out


def _json_or_text(arguments: str) -> Any:
    # Templates iterate arguments as a mapping (Qwen, Llama); fall back to the raw text.
    try:
        return json.loads(arguments)
    except json.JSONDecodeError:
        return arguments


def template_tools(request: ChatCompletionRequest) -> list[dict[str, Any]] | None:
    if not request.tools or request.tool_choice == "none":
        return None
    return [tool.model_dump(exclude_none=True) for tool in request.tools]


def chat_prompt_tokens(tokenizer: Any, request: ChatCompletionRequest) -> list[int]:
    return render_chat(
        tokenizer,
        template_messages(request),
        template_tools(request),
        request.chat_template_kwargs,
    )


def completion_prompt_tokens(tokenizer: Any, request: CompletionRequest) -> list[int]:
    prompt = request.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
        vocab_size = len(tokenizer.get_vocab())
        ids = [int(t) for t in prompt]
        if any(t < 0 or t >= vocab_size for t in ids):
            raise bad_request("prompt contains token ids outside the vocabulary", "prompt")
        return ids
    text: object = prompt[0] if isinstance(prompt, list) else prompt
    if not isinstance(text, str) or not text:
        raise bad_request("the prompt is empty", "prompt")
    return as_token_list(tokenizer.encode(text))


def usage_dict(usage: Usage) -> UsageDict:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
    }


def finish_reason(reason: FinishReason) -> str:
    if reason in (FinishReason.LENGTH, FinishReason.TOOL_CALLS):
        return reason.value
    return "stop"


class ChatChunks:
    """Builds the chunks of one streamed chat completion (same id and created)."""

    def __init__(self, request_id: str, model: str) -> None:
        self.base = {
            "id": request_id,
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": model,
        }

    def chunk(self, delta: dict[str, Any], reason: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "finish_reason": reason, "logprobs": None}
        return {**self.base, "choices": [choice]}

    def usage(self, usage: Usage) -> dict[str, Any]:
        return {**self.base, "choices": [], "usage": usage_dict(usage)}


def chat_response(
    request_id: str, model: str, message: dict[str, Any], reason: str, usage: Usage
) -> dict[str, Any]:
    return {
        "id": request_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": reason, "logprobs": None}],
        "usage": usage_dict(usage),
    }


def completion_chunk(
    request_id: str, model: str, text: str, reason: str | None, created: int
) -> dict[str, Any]:
    return {
        "id": request_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": reason}],
    }
