"""The tokenizer's chat template, applied the same way for every protocol.

Both the OpenAI and the Anthropic adapters turn their wire messages into Hugging Face
style message dicts (tool calls as objects) and call ``render_chat``; the prompt a
request is charged for is exactly what this returns, so token counting can reuse it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from vllm_mlx.api.errors import APIError, bad_request


def render_chat(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
    template_kwargs: Mapping[str, Any] | None = None,
    *,
    continue_final_message: bool = False,
) -> list[int]:
    """Prompt token ids for a chat; template errors become a 400."""
    tokens = _apply(tokenizer, messages, tools, template_kwargs, continue_final_message, True)
    return as_token_list(tokens)


def render_chat_text(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
    template_kwargs: Mapping[str, Any] | None = None,
    continue_final_message: bool = False,
) -> str:
    """The chat as text (a VLM's processor expands its images before tokenising)."""
    text = _apply(tokenizer, messages, tools, template_kwargs, continue_final_message, False)
    return str(text)


def _apply(
    tokenizer: Any,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
    template_kwargs: Mapping[str, Any] | None,
    continue_final_message: bool,
    tokenize: bool,
) -> Any:
    kwargs = dict(template_kwargs or {})
    if continue_final_message:
        # Prefill: the reply continues the last (assistant) message instead of a new turn.
        kwargs["continue_final_message"] = True
    try:
        return tokenizer.apply_chat_template(
            list(messages),
            tools=list(tools) if tools else None,
            add_generation_prompt=not continue_final_message,
            tokenize=tokenize,
            **kwargs,
        )
    except APIError:
        raise
    except Exception as exc:  # template errors (jinja raise_exception, bad roles)
        raise bad_request(f"the chat template rejected the messages: {exc}", "messages") from exc


def as_token_list(tokens: Any) -> list[int]:
    """apply_chat_template / encode results (list, BatchEncoding, dict) as a plain list."""
    if isinstance(tokens, dict) or hasattr(tokens, "input_ids"):
        tokens = tokens["input_ids"]
    return [int(t) for t in tokens]
