"""Anthropic wire <-> neutral records: prompts, stop reasons, errors, model cards.

A Messages request becomes Hugging Face style chat messages (tool calls as objects,
tool results as ``tool`` messages) rendered by the same ``render_chat`` the OpenAI
adapter uses, so count_tokens and ``usage.input_tokens`` agree by construction.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from vllm_mlx.api.anthropic.conversation import conversation, is_prefill
from vllm_mlx.api.anthropic.schema import (
    ErrorResponse,
    MessagesRequest,
    ModelInfo,
    ModelList,
    PromptFields,
    TextBlock,
    Tool,
)
from vllm_mlx.api.errors import APIError, bad_request
from vllm_mlx.api.pipeline.chat_template import render_chat
from vllm_mlx.api.pipeline.structured import ForcedTools
from vllm_mlx.api.state import ServerState
from vllm_mlx.engine.constraints import Constraint
from vllm_mlx.engine.types import Finished, FinishReason
from vllm_mlx.parsers.types import ToolSpec

ANTHROPIC_VERSION_HEADER = "anthropic-version"

ERROR_TYPES = {
    "invalid_request": "invalid_request_error",
    "authentication": "authentication_error",
    "permission": "permission_error",
    "not_found": "not_found_error",
    "rate_limit": "rate_limit_error",
    "unavailable": "overloaded_error",
    "overloaded": "overloaded_error",
    "timeout": "api_error",
    "server_error": "api_error",
}

_ERROR_TYPES_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def error_type(error: APIError) -> str:
    """The neutral kind decides; a kind this adapter does not know falls back to the status."""
    if error.kind in ERROR_TYPES:
        return ERROR_TYPES[error.kind]
    fallback = "api_error" if error.status >= 500 else "invalid_request_error"
    return _ERROR_TYPES_BY_STATUS.get(error.status, fallback)


def error_body(error: APIError) -> ErrorResponse:
    return {"type": "error", "error": {"type": error_type(error), "message": error.message}}


# --- requests -> chat template -------------------------------------------------------


@dataclass
class ChatPrompt:
    """Everything render_chat needs, plus what the output parser needs to know."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    continue_final: bool = False
    tool_specs: list[ToolSpec] = field(default_factory=list)
    max_tool_calls: int | None = None  # 1 with disable_parallel_tool_use


def build_prompt(request: PromptFields) -> ChatPrompt:
    offered = offered_tools(request)
    choice = request.tool_choice
    messages = conversation(request.messages)
    continue_final = is_prefill(messages)
    system = "\n\n".join(
        part for part in (_system_text(request), _tool_instruction(request, offered)) if part
    )
    if system:
        messages.insert(0, {"role": "system", "content": system})
    kwargs: dict[str, Any] = {}
    if request.thinking is not None:
        # Templates with a thinking switch (Qwen3 and kin) read enable_thinking.
        kwargs["enable_thinking"] = request.thinking.type != "disabled"
    return ChatPrompt(
        messages=messages,
        tools=[_template_tool(tool) for tool in offered] or None,
        template_kwargs=kwargs,
        continue_final=continue_final,
        tool_specs=[ToolSpec(tool.name, tool.input_schema) for tool in offered],
        max_tool_calls=1 if choice and choice.disable_parallel_tool_use else None,
    )


def prompt_tokens(tokenizer: Any, prompt: ChatPrompt) -> list[int]:
    return render_chat(
        tokenizer,
        prompt.messages,
        prompt.tools,
        prompt.template_kwargs,
        continue_final_message=prompt.continue_final,
    )


def _system_text(request: PromptFields) -> str:
    """`system`, then the text of any system-role messages, as one system prompt.

    Claude Code sends extra instructions as role "system" messages between turns.
    Many chat templates accept a system message only first, so they join `system`.
    """
    parts = ["\n".join(block.text for block in request.system)]
    for index, message in enumerate(request.messages):
        if message.role != "system":
            continue
        texts: list[str] = []
        for position, block in enumerate(message.content):
            if not isinstance(block, TextBlock):
                where = f"messages[{index}].content[{position}]"
                raise bad_request(f"{where}: system messages may hold only text blocks", where)
            texts.append(block.text)
        parts.append("\n".join(texts))
    return "\n\n".join(part for part in parts if part)


def offered_tools(request: PromptFields) -> list[Tool]:
    """The tools the template sees, after tool_choice."""
    tools = list(request.tools or [])
    for index, tool in enumerate(tools):
        if tool.type not in (None, "custom"):
            raise bad_request(
                f"server tool '{tool.name}' (type '{tool.type}') is not available here; "
                "only client tools with an input_schema are supported",
                f"tools[{index}]",
            )
    choice = request.tool_choice
    if choice is None or choice.type == "auto":
        return tools
    if choice.type == "none":
        return []
    if not tools:
        raise bad_request(f"tool_choice '{choice.type}' needs at least one tool in 'tools'")
    if choice.type == "any":
        return tools
    named = [tool for tool in tools if tool.name == choice.name]
    if not named:
        raise bad_request(
            f"tool_choice names the tool '{choice.name}', which is not in 'tools'",
            "tool_choice.name",
        )
    return named


def _tool_instruction(request: PromptFields, offered: list[Tool]) -> str:
    # Said in the prompt too: the grammar (forced_tools) guarantees the calls' shape,
    # the instruction helps the model fill them with something sensible.
    choice = request.tool_choice
    if choice is None or choice.type in ("auto", "none"):
        return ""
    if choice.type == "tool":
        return f"You must respond by calling the tool '{offered[0].name}'."
    return "You must respond by calling one of the provided tools."


def _template_tool(tool: Tool) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool.name, "parameters": tool.input_schema}
    if tool.description:
        function["description"] = tool.description
    return {"type": "function", "function": function}


# --- engine results -> wire -----------------------------------------------------------


def stop_reason(finished: Finished, used_tools: bool) -> str:
    if finished.stop_sequence is not None:
        return "stop_sequence"
    if finished.reason is FinishReason.LENGTH:
        return "max_tokens"
    if used_tools or finished.reason is FinishReason.TOOL_CALLS:
        return "tool_use"
    return "end_turn"


# --- /v1/models in Anthropic's shape ---------------------------------------------------


def wants_anthropic(headers: Mapping[str, str]) -> bool:
    """Anthropic SDKs and Claude Code always send anthropic-version; OpenAI clients never."""
    return ANTHROPIC_VERSION_HEADER in headers


def _rfc3339(timestamp: int) -> str:
    return datetime.fromtimestamp(timestamp, UTC).isoformat().replace("+00:00", "Z")


def model_infos(state: ServerState) -> list[ModelInfo]:
    infos: list[ModelInfo] = []
    for entry in state.registry.entries():
        name = entry.settings.name
        context = entry.engine.context_length if entry.engine is not None else None
        for model_id in (name, *state.registry.aliases_of(name)):
            infos.append(
                {
                    "type": "model",
                    "id": model_id,
                    "display_name": model_id,
                    "created_at": _rfc3339(entry.created),
                    "lifecycle": "active",
                    "max_input_tokens": context,
                }
            )
    return infos


def model_list(state: ServerState) -> ModelList:
    # Every served model fits in one page, so there is never a next page.
    infos = model_infos(state)
    return {
        "data": infos,
        "has_more": False,
        "first_id": infos[0]["id"] if infos else None,
        "last_id": infos[-1]["id"] if infos else None,
    }


def find_model(state: ServerState, model_id: str) -> ModelInfo | None:
    return next((info for info in model_infos(state) if info["id"] == model_id), None)


# --- structured outputs (docs/structured-outputs.md) -------------------------------------


def forced_tools(request: MessagesRequest, prompt: ChatPrompt) -> ForcedTools | None:
    """tool_choice "any" or "tool": the output must be tool_use blocks."""
    choice = request.tool_choice
    if choice is None or choice.type not in ("any", "tool") or not prompt.tool_specs:
        return None
    names = [tool.name for tool in request.tools or []]
    params = [f"tools[{names.index(spec.name)}].input_schema" for spec in prompt.tool_specs]
    return ForcedTools(
        prompt.tool_specs, params, named=choice.type == "tool", single=prompt.max_tool_calls == 1
    )


def output_constraint(request: MessagesRequest) -> Constraint | None:
    config_format = request.output_config.format if request.output_config else None
    if request.output_format is not None and config_format is not None:
        raise bad_request(
            "give the output format once: output_config.format or output_format",
            "output_format",
        )
    if config_format is not None:
        return Constraint("json_schema", config_format.schema_, "output_config.format.schema")
    if request.output_format is not None:
        return Constraint("json_schema", request.output_format.schema_, "output_format.schema")
    return None
