"""IBM Granite 3.x (``<|tool_call|>`` + JSON array) and Granite 4.x (``<tool_call>``).

    <|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}]

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

Granite 3 has no closing marker: the region ends where the JSON array closes.
"""

from __future__ import annotations

from vllm_mlx.parsers._text import MALFORMED, skip_space, strip_markers
from vllm_mlx.parsers.tool_calls._shared import json_text_calls
from vllm_mlx.parsers.tool_calls.base import RawCall, ToolCallParser

GRANITE3 = "<|tool_call|>"
START, END = "<tool_call>", "</tool_call>"


class GraniteToolCallParser(ToolCallParser):
    name = "granite"
    start_markers = (GRANITE3, START)
    end_markers = ((START, END),)

    def find_end(self, text: str, *, final: bool) -> int | None:
        if not text.startswith(GRANITE3):
            return super().find_end(text, final=final)
        end = self.scanner.end(text, skip_space(text, len(GRANITE3)))
        return len(GRANITE3) if end == MALFORMED else end

    def parse_region(self, region: str) -> list[RawCall] | None:
        return json_text_calls(strip_markers(region.removeprefix(GRANITE3), START, END))
