"""One object per request that turns model text into content, reasoning and calls.

The reasoning parser sees the text first. Only what it passes on as content reaches
the tool-call parser, so a call the model drafts while thinking stays reasoning and
only calls it makes in its answer are parsed.
"""

from __future__ import annotations

from collections.abc import Sequence

from vllm_mlx.parsers.reasoning import ReasoningEvent, ReasoningParser, get_reasoning_parser
from vllm_mlx.parsers.tool_calls import ToolCallParser, get_tool_call_parser
from vllm_mlx.parsers.types import ContentDelta, ParsedOutput, ParserEvent, ToolSpec, collect_events


class OutputParser:
    """Same feed/finish/parse API as the parsers it combines; either may be absent."""

    def __init__(
        self, reasoning: ReasoningParser | None = None, tool_calls: ToolCallParser | None = None
    ) -> None:
        self.reasoning = reasoning
        self.tool_calls = tool_calls

    def feed(self, text: str) -> list[ParserEvent]:
        if self.reasoning is None:
            return self._to_tools([ContentDelta(text)] if text else [])
        return self._to_tools(self.reasoning.feed(text))

    def finish(self) -> list[ParserEvent]:
        events = self._to_tools(self.reasoning.finish() if self.reasoning else [])
        if self.tool_calls is not None:
            events.extend(self.tool_calls.finish())
        return events

    def parse(self, text: str) -> ParsedOutput:
        fresh = self.spawn()
        return collect_events([*fresh.feed(text), *fresh.finish()])

    def spawn(self) -> OutputParser:
        return OutputParser(
            self.reasoning.spawn() if self.reasoning else None,
            self.tool_calls.spawn() if self.tool_calls else None,
        )

    def _to_tools(self, events: Sequence[ReasoningEvent]) -> list[ParserEvent]:
        if self.tool_calls is None:
            return list(events)
        out: list[ParserEvent] = []
        for event in events:
            if isinstance(event, ContentDelta):
                out.extend(self.tool_calls.feed(event.text))
            else:
                out.append(event)
        return out


def make_output_parser(
    tool_parser: str | None,
    reasoning_parser: str | None,
    tools: Sequence[ToolSpec] | None,
    starts_in_reasoning: bool,
) -> OutputParser:
    """Build the parser for one request; unknown names raise UnknownParserError.

    ``tools=None`` accepts calls to any name; a sequence (even empty) accepts only
    those tools, and calls to other names come back as content.
    """
    reasoning = None
    if reasoning_parser is not None:
        reasoning_cls = get_reasoning_parser(reasoning_parser)
        reasoning = reasoning_cls(starts_in_reasoning=starts_in_reasoning)
    calls = None
    if tool_parser is not None:
        calls = get_tool_call_parser(tool_parser)(tools)
    return OutputParser(reasoning, calls)
