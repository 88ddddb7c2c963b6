"""Anthropic wire <-> neutral records: prompts, stop reasons, structured outputs.

A Messages request becomes Hugging Face style chat messages (tool calls as objects,
tool results as ``tool`` messages) rendered by the same ``render_chat`` the OpenAI
adapter uses, so count_tokens and ``usage.input_tokens`` agree by construction.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from vllm_mlx.api.anthropic.conversation import conversation, is_prefill
from vllm_mlx.api.anthropic.schema import (
    MessagesRequest,
    PromptFields,
    TextBlock,
    Tool,
    UsageDict,
)
from vllm_mlx.api.errors import bad_request
from vllm_mlx.api.pipeline.canonical import canonical_system
from vllm_mlx.api.pipeline.chat_template import render_chat
from vllm_mlx.api.pipeline.structured import ForcedTools
from vllm_mlx.api.pipeline.turn import Prompt, Turn
from vllm_mlx.api.pipeline.vision import ImageParts, chat_prompt
from vllm_mlx.engine.constraints import Constraint
from vllm_mlx.engine.types import Finished, FinishReason, Usage
from vllm_mlx.parsers.types import ToolSpec

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


def build_prompt(
    request: PromptFields, volatile: Sequence[str] = (), images: ImageParts | None = None
) -> ChatPrompt:
    """`volatile`: engine.prompt_canonicalization, the system lines left out; `images`:
    where a vision model's request collects its images."""
    offered = offered_tools(request)
    choice = request.tool_choice
    messages = conversation(request.messages, images)
    continue_final = is_prefill(messages)
    system_text = _system_text(request, volatile)
    system = "\n\n".join(
        part for part in (system_text, _tool_instruction(request, offered)) if part
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


async def turn_prompt(turn: Turn, images: ImageParts, prompt: ChatPrompt) -> Prompt:
    """The request's prompt, its images' tiles included (api/pipeline/vision.py)."""
    return await chat_prompt(
        turn,
        images,
        prompt.messages,
        prompt.tools,
        prompt.template_kwargs,
        continue_final_message=prompt.continue_final,
    )


def prompt_tokens(tokenizer: Any, prompt: ChatPrompt) -> list[int]:
    return render_chat(
        tokenizer,
        prompt.messages,
        prompt.tools,
        prompt.template_kwargs,
        continue_final_message=prompt.continue_final,
    )


def _system_text(request: PromptFields, volatile: Sequence[str]) -> str:
    """`system`, then the text of any system-role messages, as one system prompt.

    Claude Code sends extra instructions as role "system" messages between turns.
    Many chat templates accept a system message only first, so they join `system`.
    """
    blocks = (canonical_system(block.text, volatile) for block in request.system)
    parts = ["\n".join(text for text in blocks if text)]
    for index, message in enumerate(request.messages):
        if message.role != "system":
            continue
        texts: list[str] = []
        for position, block in enumerate(message.content):
            if not isinstance(block, TextBlock):
                where = f"messages[{index}].content[{position}]"
                raise bad_request(f"{where}: system messages may hold only text blocks", where)
            texts.append(block.text)
        parts.append(canonical_system("\n".join(texts), volatile))
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


def usage_dict(usage: Usage) -> UsageDict:
    return {
        "input_tokens": usage.uncached_tokens,
        "output_tokens": usage.completion_tokens,
        "cache_read_input_tokens": usage.cached_tokens,
        "cache_creation_input_tokens": usage.cache_write_tokens,
    }
