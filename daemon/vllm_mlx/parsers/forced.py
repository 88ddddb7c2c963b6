"""Tool calls the grammar forced, read back as they stream.

With a forced tool choice the output is constrained (engine/constraints.py), so its
shape is known exactly and no model-specific format is involved:

- a named tool: the output *is* the arguments object;
- any tool (OpenAI "required", Anthropic "any"): a JSON list of
  ``{"name": ..., "arguments": {...}}`` objects over the offered tools.

Both stream token by token: a call starts as soon as its name is complete and its
arguments are passed on as they grow.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from vllm_mlx.parsers.tool_calls.base import ToolCallParser
from vllm_mlx.parsers.types import (
    ContentDelta,
    ParserEvent,
    ToolCallArgumentsDelta,
    ToolCallStart,
    ToolSpec,
    new_tool_call_id,
)

# The list items' key order is the schema's (name, then arguments).
_CALL_HEAD = re.compile(r'\s*,?\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*')


def call_list_schema(tools: Sequence[ToolSpec], single: bool) -> dict[str, Any]:
    """The JSON schema of a list of calls to the offered tools (one with ``single``)."""
    items = [
        {
            "type": "object",
            "properties": {
                "name": {"const": tool.name},
                "arguments": tool.parameters or {"type": "object"},
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for tool in tools
    ]
    schema: dict[str, Any] = {
        "type": "array",
        "items": items[0] if len(items) == 1 else {"anyOf": items},
        "minItems": 1,
    }
    if single:
        schema["maxItems"] = 1
    return schema


def arguments_schema(tool: ToolSpec) -> dict[str, Any]:
    return tool.parameters or {"type": "object"}


class NamedCallParser(ToolCallParser):
    """The whole output is the arguments of one call to ``tools[0]``."""

    def __init__(self, tools: Sequence[ToolSpec] | None) -> None:
        super().__init__(tools)
        assert tools, "a named call needs its tool"
        self._started = False

    def feed(self, text: str) -> list[ParserEvent]:
        events: list[ParserEvent] = []
        if not text:
            return events
        if not self._started:
            assert self.tools is not None
            events.append(ToolCallStart(0, new_tool_call_id(), self.tools[0].name))
            self._started = True
        events.append(ToolCallArgumentsDelta(0, text))
        return events

    def finish(self) -> list[ParserEvent]:
        return []  # cut before any argument text (max_tokens while thinking): no call

    def spawn(self) -> NamedCallParser:
        return NamedCallParser(self.tools)


class CallListParser(ToolCallParser):
    """A constrained list of ``{"name", "arguments"}`` objects, as calls."""

    def __init__(self, tools: Sequence[ToolSpec] | None) -> None:
        super().__init__(tools)
        self._text = ""
        self._at = 0  # how far the text has been turned into events
        self._index = -1
        self._in_arguments = False
        self._depth = 0  # bracket depth inside the arguments
        self._quote = False
        self._escape = False

    def feed(self, text: str) -> list[ParserEvent]:
        self._text += text
        events: list[ParserEvent] = []
        while self._at < len(self._text):
            if self._in_arguments:
                self._arguments(events)
            elif not self._head(events):
                break
        return events

    def finish(self) -> list[ParserEvent]:
        # Cut by max_tokens before a call began: what is left is not a call.
        rest = self._text[self._at :].strip().lstrip("[").strip()
        if self._index < 0 and rest:
            self._at = len(self._text)
            return [ContentDelta(rest)]
        return []

    def spawn(self) -> CallListParser:
        return CallListParser(self.tools)

    def _head(self, events: list[ParserEvent]) -> bool:
        """Between calls: start the next call once its name is complete."""
        rest = self._text[self._at :]
        stripped = rest.lstrip(" \n\t[")
        if stripped.startswith(("}", "]")):  # the end of a call or of the list
            self._at += len(rest) - len(stripped) + 1
            return True
        match = _CALL_HEAD.match(stripped)
        if match is None:
            return False  # wait for more text
        self._at += len(rest) - len(stripped) + match.end()
        self._index += 1
        name = json.loads(match.group(1))
        events.append(ToolCallStart(self._index, new_tool_call_id(), name))
        self._in_arguments, self._depth = True, 0
        return True

    def _arguments(self, events: list[ParserEvent]) -> None:
        text = self._text
        if self._depth == 0:  # blanks before the arguments value are not part of it
            self._at += len(text) - self._at - len(text[self._at :].lstrip())
        start = self._at
        end = len(text)
        for pos in range(start, len(text)):
            char = text[pos]
            if self._quote:
                if self._escape:
                    self._escape = False
                elif char == "\\":
                    self._escape = True
                elif char == '"':
                    self._quote = False
            elif char == '"':
                self._quote = True
            elif char in "{[":
                self._depth += 1
            elif char in "}]":
                self._depth -= 1
                if self._depth == 0:
                    end = pos + 1
                    self._in_arguments = False
                    break
        self._at = end
        if end > start:
            events.append(ToolCallArgumentsDelta(self._index, text[start:end]))
