"""Anthropic messages -> Hugging Face style chat messages (what the template renders).

Tool calls become `tool_calls` on the assistant message, tool results `tool` messages.
An assistant message may also carry calls the server already ran: a streamed reply
with `mcp_tools: execute` has each executed `tool_use` followed by its
`mcp_tool_result` in the same message (the block type of Anthropic's MCP connector,
whose `mcp_tool_use` is read as a `tool_use`). A client that sends that message back
in its history gets the calls, their results and the text after them in order.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vllm_mlx.api.anthropic.schema import (
    DocumentBlock,
    ImageBlock,
    InputMessage,
    McpToolResultBlock,
    McpToolUseBlock,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from vllm_mlx.api.errors import APIError, bad_request
from vllm_mlx.api.pipeline.vision import ImageParts, content


def conversation(
    messages: list[InputMessage], images: ImageParts | None = None
) -> list[dict[str, Any]]:
    """`images`: where a vision model's request collects its images (None: refused)."""
    out: list[dict[str, Any]] = []
    open_calls: dict[str, str] = {}  # tool_use id -> name, from the previous assistant turn
    for index, message in enumerate(messages):
        if message.role == "system":
            continue  # part of the system prompt (convert._system_text)
        if message.role == "assistant":
            items, open_calls = _assistant_messages(message, index)
            out.extend(items)
        else:
            out.extend(_user_messages(message, index, open_calls, images))
            open_calls = {}
    return out


def is_prefill(messages: list[dict[str, Any]]) -> bool:
    """A final assistant turn is a prefill the reply continues (Anthropic semantics)."""
    if not messages or messages[-1]["role"] != "assistant":
        return False
    last = messages[-1]
    if last.get("tool_calls"):
        raise bad_request(
            "the last message is an assistant turn with tool_use blocks; send their "
            "tool_result blocks in a following user message",
            f"messages[{len(messages) - 1}]",
        )
    if not last["content"]:
        messages.pop()  # an empty prefill constrains nothing: answer a normal new turn
        return False
    return True


def _unsupported(block: ImageBlock | DocumentBlock, where: str) -> APIError:
    what = "images" if isinstance(block, ImageBlock) else "documents"
    # Anthropic errors have no param field: the location goes into the message.
    return bad_request(f"{where}: model does not accept {what}", where, "unsupported_content")


def _image(block: ImageBlock, where: str, images: ImageParts | None) -> dict[str, Any]:
    """An image block's content part: its `base64` or `url` source, read as a URL."""
    if images is None or images.tower is None:
        raise _unsupported(block, where)
    source = block.source or {}
    kind = source.get("type")
    if kind == "base64":
        media, data = source.get("media_type"), source.get("data")
        if not isinstance(media, str) or not isinstance(data, str):
            raise bad_request(
                f"{where}.source: a base64 source needs media_type and data strings",
                f"{where}.source",
                "invalid_image",
            )
        return images.part(f"data:{media};base64,{data}", f"{where}.source.data")
    if kind == "url":
        return images.part(source.get("url") or "", f"{where}.source.url")
    raise bad_request(
        f"{where}.source: image sources are `base64` or `url`, not {kind!r}",
        f"{where}.source.type",
        "invalid_image",
    )


@dataclass
class _Turn:
    """One assistant message of the template: text, reasoning and calls, in order."""

    texts: list[str] = field(default_factory=list)
    thinking: list[str] = field(default_factory=list)
    calls: list[dict[str, Any]] = field(default_factory=list)

    def empty(self) -> bool:
        return not (self.texts or self.thinking or self.calls)

    def message(self) -> dict[str, Any]:
        item: dict[str, Any] = {"role": "assistant", "content": "".join(self.texts)}
        if self.calls:
            item["tool_calls"] = self.calls
        if self.thinking:
            item["reasoning_content"] = "".join(self.thinking)  # the key HF templates read
        return item


def _assistant_messages(
    message: InputMessage, index: int
) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """The template's messages for one assistant message, and its calls still open
    (their tool_result blocks must come in the next user message)."""
    out: list[dict[str, Any]] = []
    turn = _Turn()
    names: dict[str, str] = {}  # every call of this message: id -> name
    answered: set[str] = set()
    for position, block in enumerate(message.content):
        where = f"messages[{index}].content[{position}]"
        if isinstance(block, McpToolResultBlock):
            if not turn.empty():  # the calls so far, then their results
                out.append(turn.message())
                turn = _Turn()
            if block.tool_use_id not in names or block.tool_use_id in answered:
                raise bad_request(
                    f"{where}: mcp_tool_result block has tool_use_id '{block.tool_use_id}', "
                    "but no earlier tool_use block of this message without a result has it",
                    f"{where}.tool_use_id",
                )
            answered.add(block.tool_use_id)
            out.append(_tool_message(block, where, names))
            continue
        if isinstance(block, TextBlock):
            turn.texts.append(block.text)
        elif isinstance(block, ThinkingBlock):
            turn.thinking.append(block.thinking)
        elif isinstance(block, RedactedThinkingBlock):
            continue  # opaque by definition: nothing a local model could read
        elif isinstance(block, ToolUseBlock | McpToolUseBlock):
            function = {"name": block.name, "arguments": block.input}
            turn.calls.append({"id": block.id, "type": "function", "function": function})
            names[block.id] = block.name
        elif isinstance(block, ImageBlock | DocumentBlock):
            raise _unsupported(block, where)
        else:
            raise bad_request(f"{where}: tool_result blocks belong in user messages", where)
    if not turn.empty() or not out:
        out.append(turn.message())
    open_calls = {id_: name for id_, name in names.items() if id_ not in answered}
    return out, open_calls


def _user_messages(
    message: InputMessage,
    index: int,
    open_calls: Mapping[str, str],
    images: ImageParts | None = None,
) -> list[dict[str, Any]]:
    """Tool results become ``tool`` messages, followed by the user's own text and
    images, if any."""
    out: list[dict[str, Any]] = []
    texts: list[str | dict[str, Any]] = []
    for position, block in enumerate(message.content):
        where = f"messages[{index}].content[{position}]"
        if isinstance(block, TextBlock):
            texts.append(block.text)
        elif isinstance(block, ImageBlock):
            texts.append(_image(block, where, images))
        elif isinstance(block, ToolResultBlock):
            if block.tool_use_id not in open_calls:
                raise bad_request(
                    f"{where}: tool_result block has tool_use_id '{block.tool_use_id}', but "
                    "the previous assistant message has no tool_use block with that id",
                    f"{where}.tool_use_id",
                )
            out.append(_tool_message(block, where, open_calls, images))
        elif isinstance(block, DocumentBlock):
            raise _unsupported(block, where)
        else:
            raise bad_request(f"{where}: {block.type} blocks belong in assistant messages", where)
    if texts or not out:
        out.append({"role": "user", "content": content(texts, "\n")})
    return out


def _tool_message(
    block: ToolResultBlock | McpToolResultBlock,
    where: str,
    names: Mapping[str, str],
    images: ImageParts | None = None,
) -> dict[str, Any]:
    parts: list[str | dict[str, Any]] = []
    for position, part in enumerate(block.content):
        if isinstance(part, ImageBlock):  # a screenshot tool's result, say
            parts.append(_image(part, f"{where}.content[{position}]", images))
        else:
            parts.append(part.text)
    if block.is_error:
        first = parts[0] if parts else None
        parts[:1] = [f"Error: {first}"] if isinstance(first, str) else ["Error: ", *parts[:1]]
    joined = content(parts, "\n")
    return {
        "role": "tool",
        "tool_call_id": block.tool_use_id,
        "name": names[block.tool_use_id],
        "content": joined,
    }
