"""Zhipu GLM-4.5 / GLM-4.6 / GLM-4.7 (XML-ish key/value pairs inside <tool_call>).

    <tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>Paris</arg_value>
    </tool_call>

GLM-4.7 drops the newlines: ``<tool_call>get_weather<arg_key>city</arg_key>...``.
Values are strings for string-typed parameters and JSON otherwise.
"""

from __future__ import annotations

from vllm_mlx.parsers._text import strip_markers
from vllm_mlx.parsers.tool_calls._shared import mlx_calls
from vllm_mlx.parsers.tool_calls.base import RawCall, ToolCallParser

START, END = "<tool_call>", "</tool_call>"


class Glm47ToolCallParser(ToolCallParser):
    name = "glm47"
    start_markers = (START,)
    end_markers = ((START, END),)

    def parse_region(self, region: str) -> list[RawCall] | None:
        body = strip_markers(region, START, END)
        if not body:
            return None
        # mlx-lm's glm47 parser knows the schema-driven value typing.
        return mlx_calls("glm47", body, self.tools)
