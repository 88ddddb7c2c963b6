"""The streaming engine that every tool-call format plugs into.

A format says where a call region may start (``start_markers`` and friends), where
it ends (``find_end``) and what calls it holds (``parse_region``). The engine does
the rest the same way for every format: it streams content up to the point where a
region could begin, buffers the region until it is complete, then emits its calls,
or gives the region's text back as content when it does not parse. ``parse`` runs
the same engine over the whole text, so streaming and non-streaming cannot disagree.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from vllm_mlx.parsers._text import BracketScanner, StartPatterns, WhitespaceTrim, marker_region
from vllm_mlx.parsers.types import (
    ContentDelta,
    ParsedOutput,
    ParserEvent,
    ToolCall,
    ToolCallArgumentsDelta,
    ToolCallStart,
    ToolSpec,
    collect_events,
    new_tool_call_id,
)

# Tool names as clients declare them (OpenAI allows [a-zA-Z0-9_-], MCP adds . : /).
_NAME = re.compile(r"[\w.:/\-]{1,256}")


@dataclass(frozen=True)
class RawCall:
    """A call as a format found it, before validation against the offered tools."""

    name: Any
    arguments: Any
    id: str | None = None


Region = tuple[int, list[RawCall] | None]
"""(end, calls): the region is text[:end]; calls None means "not a call: content"."""


_PATTERNS: dict[type[ToolCallParser], StartPatterns] = {}


def _start_patterns(cls: type[ToolCallParser]) -> StartPatterns:
    if cls not in _PATTERNS:
        _PATTERNS[cls] = StartPatterns.build(
            cls.start_markers, cls.start_patterns, cls.leading_patterns
        )
    return _PATTERNS[cls]


class ToolCallParser:
    """Base class of all tool-call formats; one instance parses one model output."""

    name: ClassVar[str] = ""
    start_markers: ClassVar[tuple[str, ...]] = ()
    """Literal strings that open a call region anywhere in the output."""
    start_patterns: ClassVar[tuple[str, ...]] = ()
    """Regular expressions that open a call region anywhere in the output."""
    leading_patterns: ClassVar[tuple[str, ...]] = ()
    """Regular expressions that open a call region only at the start of the output."""
    end_markers: ClassVar[tuple[tuple[str, str], ...]] = ()
    """For paired formats: (start marker, the marker that closes its region)."""

    def __init__(self, tools: Sequence[ToolSpec] | None) -> None:
        self.tools = None if tools is None else tuple(tools)
        self._names = None if tools is None else frozenset(tool.name for tool in tools)
        self._buffer = ""
        self._in_region = False
        self._region_at_start = False
        self._at_start = True
        self._content = WhitespaceTrim()
        self._calls = 0
        # Shared by the formats whose calls end at a closing bracket, so that each
        # rescan of a growing region resumes instead of starting over.
        self.scanner = BracketScanner()

    # -- the format's hooks ------------------------------------------------------------

    def find_start(self, text: str, *, at_start: bool, final: bool) -> tuple[int, int]:
        """(start, safe): see StartPatterns.find."""
        return _start_patterns(type(self)).find(text, at_start=at_start, final=final)

    def take_region(self, text: str, *, at_start: bool, final: bool) -> Region | None:
        """``text`` starts at a region start; None while its end is not known yet."""
        end = self.find_end(text, final=final)
        if end is None:
            return None
        return end, self.parse_region(text[:end])

    def find_end(self, text: str, *, final: bool) -> int | None:
        """End of the region that starts ``text``; None while it may still grow."""
        for start, end in self.end_markers:
            if text.startswith(start):
                return marker_region(text, end, len(start))
        raise NotImplementedError(f"{type(self).__name__} has no end for {text[:20]!r}")

    def parse_region(self, region: str) -> list[RawCall] | None:
        """The calls in a complete region; None when it is not a well-formed call."""
        raise NotImplementedError

    def make_id(self, raw: RawCall) -> str:
        return new_tool_call_id()

    # -- public API ----------------------------------------------------------------------

    def feed(self, text: str) -> list[ParserEvent]:
        self._buffer += text
        return self._drain(final=False)

    def finish(self) -> list[ParserEvent]:
        return self._drain(final=True)

    def parse(self, text: str) -> ParsedOutput:
        fresh = self.spawn()
        return collect_events(fresh.feed(text) + fresh.finish())

    def spawn(self) -> ToolCallParser:
        """A new parser of the same format and tools, with no text fed yet."""
        return type(self)(self.tools)

    def accept(self, raws: list[RawCall]) -> list[ToolCall] | None:
        """Validate raw calls against the offered tools; None rejects the region."""
        calls: list[ToolCall] = []
        for raw in raws:
            arguments = raw.arguments
            if isinstance(arguments, str):
                # Some templates and models write the arguments as a JSON string.
                try:
                    arguments = json.loads(arguments) if arguments.strip() else {}
                except ValueError:
                    return None
            if arguments is None:
                arguments = {}
            if not isinstance(raw.name, str) or not _NAME.fullmatch(raw.name):
                return None
            if not isinstance(arguments, dict):
                return None
            if self._names is not None and raw.name not in self._names:
                return None
            text = json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))
            calls.append(ToolCall(id=self.make_id(raw), name=raw.name, arguments=text))
        return calls

    # -- the engine ----------------------------------------------------------------------

    def _drain(self, *, final: bool) -> list[ParserEvent]:
        events: list[ParserEvent] = []
        while self._buffer:
            if not self._in_region and not self._enter_region(events, final):
                break
            taken = self.take_region(self._buffer, at_start=self._region_at_start, final=final)
            if taken is None:
                if not final:
                    break
                # Unterminated at the end of the output: it was not a call after all.
                taken = (len(self._buffer), None)
            end, raws = taken
            end = min(max(end, 1), len(self._buffer))
            region, self._buffer = self._buffer[:end], self._buffer[end:]
            self._in_region = False
            self._at_start = False
            calls = None if raws is None else self.accept(raws)
            if calls is None:
                self._emit_content(region, events)
            else:
                self._emit_calls(calls, events)
        return events

    def _enter_region(self, events: list[ParserEvent], final: bool) -> bool:
        """Emit the content before the next region; True when one starts the buffer."""
        start, safe = self.find_start(self._buffer, at_start=self._at_start, final=final)
        cut = start if start >= 0 else (len(self._buffer) if final else safe)
        self._emit_content(self._buffer[:cut], events)
        self._buffer = self._buffer[cut:]
        if start < 0:
            return False
        self._in_region = True
        self._region_at_start = self._at_start
        return True

    def _emit_content(self, text: str, events: list[ParserEvent]) -> None:
        if text.strip():
            self._at_start = False
        visible = self._content.push(text)
        if visible:
            events.append(ContentDelta(visible))

    def _emit_calls(self, calls: list[ToolCall], events: list[ParserEvent]) -> None:
        for call in calls:
            events.append(ToolCallStart(index=self._calls, id=call.id, name=call.name))
            events.append(ToolCallArgumentsDelta(index=self._calls, fragment=call.arguments))
            self._calls += 1
        self._content.boundary()
