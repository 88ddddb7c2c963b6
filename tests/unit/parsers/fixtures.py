"""Loading the recorded model outputs under tests/fixtures/parsers/ and comparing results."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_mlx.parsers import (
    OutputParser,
    ParsedOutput,
    ParserEvent,
    ToolSpec,
    collect_events,
    make_output_parser,
)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "parsers"


@dataclass(frozen=True)
class Case:
    parser: str
    name: str
    text: str
    tools: tuple[ToolSpec, ...] | None
    reasoning_parser: str | None
    starts_in_reasoning: bool
    expected: dict[str, Any]

    @property
    def id(self) -> str:
        return f"{self.parser}-{self.name}"

    def output_parser(self) -> OutputParser:
        return make_output_parser(
            self.parser, self.reasoning_parser, self.tools, self.starts_in_reasoning
        )


def load_cases() -> Iterator[Case]:
    for path in sorted(FIXTURES.glob("*.json")):
        doc = json.loads(path.read_text(encoding="utf-8"))
        file_tools = tuple(ToolSpec(t["name"], t.get("parameters")) for t in doc["tools"])
        for raw in doc["cases"]:
            # A case may set "tools": null to run with no tool list (any name accepted).
            tools: tuple[ToolSpec, ...] | None = file_tools
            if "tools" in raw and raw["tools"] is None:
                tools = None
            yield Case(
                parser=doc["parser"],
                name=raw["name"],
                text=raw["text"],
                tools=tools,
                reasoning_parser=raw.get("reasoning_parser"),
                starts_in_reasoning=raw.get("starts_in_reasoning", False),
                expected=raw["expected"],
            )


CASES = list(load_cases())


def summary(parsed: ParsedOutput) -> dict[str, Any]:
    """What a client sees, with the arguments decoded so key order and spacing don't matter."""
    return {
        "content": parsed.content,
        "reasoning": parsed.reasoning,
        "tool_calls": [
            {"name": call.name, "arguments": json.loads(call.arguments)}
            for call in parsed.tool_calls
        ],
    }


def stream(parser: OutputParser, chunks: Sequence[str]) -> list[ParserEvent]:
    events: list[ParserEvent] = []
    for chunk in chunks:
        events.extend(parser.feed(chunk))
    events.extend(parser.finish())
    return events


def stream_summary(parser: OutputParser, chunks: Sequence[str]) -> dict[str, Any]:
    return summary(collect_events(stream(parser, chunks)))


def split(text: str, cuts: Sequence[int]) -> list[str]:
    points = [0, *sorted(set(cuts)), len(text)]
    return [text[a:b] for a, b in itertools.pairwise(points)]
