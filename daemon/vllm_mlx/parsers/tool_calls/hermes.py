"""NousResearch Hermes 2 Pro / Hermes 3 (and every template that copied it).

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

The JSON may also be a list of such objects.
"""

from __future__ import annotations

from vllm_mlx.parsers._text import strip_markers
from vllm_mlx.parsers.tool_calls._shared import json_text_calls
from vllm_mlx.parsers.tool_calls.base import RawCall, ToolCallParser

START, END = "<tool_call>", "</tool_call>"


class HermesToolCallParser(ToolCallParser):
    name = "hermes"
    start_markers = (START,)
    end_markers = ((START, END),)

    def parse_region(self, region: str) -> list[RawCall] | None:
        # json_tools in mlx-lm is a bare json.loads; not worth importing mlx for.
        return json_text_calls(strip_markers(region, START, END))
