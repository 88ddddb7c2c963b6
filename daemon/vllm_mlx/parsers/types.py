"""Wire-neutral records shared by the tool-call and reasoning parsers.

The OpenAI and Anthropic adapters translate these into their own wire types; nothing
here knows about either protocol.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, TypeAlias


def new_tool_call_id() -> str:
    """A fresh id in the shape OpenAI uses (``call_`` + 24 hex digits)."""
    return f"call_{secrets.token_hex(12)}"


@dataclass(frozen=True)
class ToolSpec:
    """One tool offered in the request; ``parameters`` is its JSON Schema, if any."""

    name: str
    parameters: dict[str, Any] | None = None


@dataclass(frozen=True)
class ToolCall:
    """A parsed call; ``arguments`` is the compact JSON text of an object."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ParsedOutput:
    content: str
    tool_calls: tuple[ToolCall, ...]
    reasoning: str = ""


@dataclass(frozen=True)
class ContentDelta:
    text: str


@dataclass(frozen=True)
class ReasoningDelta:
    text: str


@dataclass(frozen=True)
class ToolCallStart:
    index: int
    id: str
    name: str


@dataclass(frozen=True)
class ToolCallArgumentsDelta:
    index: int
    fragment: str


ParserEvent: TypeAlias = ContentDelta | ReasoningDelta | ToolCallStart | ToolCallArgumentsDelta


def collect_events(events: Iterable[ParserEvent]) -> ParsedOutput:
    """Assemble a stream of events into the ParsedOutput a client would rebuild."""
    content: list[str] = []
    reasoning: list[str] = []
    starts: dict[int, ToolCallStart] = {}
    arguments: dict[int, list[str]] = {}
    for event in events:
        if isinstance(event, ContentDelta):
            content.append(event.text)
        elif isinstance(event, ReasoningDelta):
            reasoning.append(event.text)
        elif isinstance(event, ToolCallStart):
            starts[event.index] = event
            arguments.setdefault(event.index, [])
        else:
            arguments.setdefault(event.index, []).append(event.fragment)
    calls = tuple(
        ToolCall(id=start.id, name=start.name, arguments="".join(arguments[index]))
        for index, start in sorted(starts.items())
    )
    return ParsedOutput(content="".join(content), tool_calls=calls, reasoning="".join(reasoning))
