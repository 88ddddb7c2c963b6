"""Qwen2.5 / Qwen3 (Hermes-style JSON) and Qwen3-Coder (XML parameters).

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

Qwen3-Coder occasionally leaves out the <tool_call> wrapper, so a bare
``<function=...>...</function>`` is accepted too.
"""

from __future__ import annotations

import re

from vllm_mlx.parsers._text import strip_markers
from vllm_mlx.parsers.tool_calls._shared import json_text_calls, mlx_calls
from vllm_mlx.parsers.tool_calls.base import RawCall, ToolCallParser

START, END = "<tool_call>", "</tool_call>"
FUNCTION, FUNCTION_END = "<function=", "</function>"
_XML_CALL = re.compile(r"<function=[^>\n]+>\s*(?:<parameter=.*)?</function>", re.DOTALL)


class QwenToolCallParser(ToolCallParser):
    name = "qwen"
    start_markers = (START, FUNCTION)
    end_markers = (
        (START, END),
        (FUNCTION, FUNCTION_END),
    )

    def parse_region(self, region: str) -> list[RawCall] | None:
        body = strip_markers(region, START, END)
        if not body.startswith(FUNCTION):
            return json_text_calls(body)
        if not _XML_CALL.fullmatch(body):
            # e.g. Functionary's <function=name>{json}</function>: not Qwen's syntax.
            return None
        # mlx-lm's qwen3_coder parser converts values by the tool's JSON Schema.
        return mlx_calls("qwen3_coder", body, self.tools)
