"""NVIDIA Llama-Nemotron (Nano 4B/8B, Super 49B) and Nemotron Nano 9B v2.

    <TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Paris"}}]</TOOLCALL>

One list holds all the parallel calls.
"""

from __future__ import annotations

from vllm_mlx.parsers._text import strip_markers
from vllm_mlx.parsers.tool_calls._shared import json_text_calls
from vllm_mlx.parsers.tool_calls.base import RawCall, ToolCallParser

START, END = "<TOOLCALL>", "</TOOLCALL>"


class NemotronToolCallParser(ToolCallParser):
    name = "nemotron"
    start_markers = (START,)
    end_markers = ((START, END),)

    def parse_region(self, region: str) -> list[RawCall] | None:
        return json_text_calls(strip_markers(region, START, END))
