"""Salesforce xLAM (xLAM-1 and xLAM-2 "Large Action Models").

xLAM answers with a JSON array of calls, on its own or in a fenced block:

    [{"name": "get_weather", "arguments": {"city": "Paris"}}]

    ```json
    [{"name": "get_weather", "arguments": {"city": "Paris"}}]
    ```

Fine-tunes also emit it after ``[TOOL_CALLS]`` or inside ``<tool_call>`` tags, and a
text answer may end with the array; ``[{"name"`` marks it there.
"""

from __future__ import annotations

from vllm_mlx.parsers._text import MALFORMED, marker_region, skip_space
from vllm_mlx.parsers.tool_calls._shared import json_text_calls
from vllm_mlx.parsers.tool_calls.base import Region, ToolCallParser

TOOL_CALLS = "[TOOL_CALLS]"
START, END = "<tool_call>", "</tool_call>"
FENCE = "```"


class XlamToolCallParser(ToolCallParser):
    name = "xlam"
    start_markers = (TOOL_CALLS, START)
    start_patterns = (r"\[\s*\{\s*\"name\"",)
    leading_patterns = (r"\[\s*\{", r"\{\s*\"", r"```(?:json)?\s*[\[{]")

    def take_region(self, text: str, *, at_start: bool, final: bool) -> Region | None:
        if text.startswith(START):
            end = marker_region(text, END, len(START))
            body_start, body_end = len(START), (end or 0) - len(END)
        elif text.startswith(FENCE):
            end = marker_region(text, FENCE, len(FENCE))
            body_start, body_end = len(FENCE), (end or 0) - len(FENCE)
        else:
            body_start = skip_space(text, len(TOOL_CALLS) if text.startswith(TOOL_CALLS) else 0)
            end = self.scanner.end(text, body_start)
            if end == MALFORMED:
                return max(body_start, 1), None
            body_end = end or 0
        if end is None:
            return None
        body = text[body_start:body_end].strip().removeprefix("json")
        return end, json_text_calls(body)
