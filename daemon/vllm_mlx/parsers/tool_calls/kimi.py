"""Moonshot Kimi K2 (Instruct and Thinking).

    <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0
    <|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|>
    <|tool_calls_section_end|>

The model's own ids (``functions.<name>:<n>``) are kept: Kimi's chat template writes
them back into the prompt and the model expects to see that shape there.
"""

from __future__ import annotations

from vllm_mlx.parsers._text import marker_region
from vllm_mlx.parsers.tool_calls._shared import mlx_calls
from vllm_mlx.parsers.tool_calls.base import RawCall, ToolCallParser

SECTION, SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CALL_END = "<|tool_call_end|>"


class KimiToolCallParser(ToolCallParser):
    name = "kimi"
    start_markers = (SECTION,)

    def find_end(self, text: str, *, final: bool) -> int | None:
        end = marker_region(text, SECTION_END, len(SECTION))
        # The model sometimes stops right after the last call without closing the
        # section; accept that at the end of the output.
        return len(text) if end is None and final else end

    def parse_region(self, region: str) -> list[RawCall] | None:
        body = region.removeprefix(SECTION).removesuffix(SECTION_END).strip()
        if not body.endswith(CALL_END):
            return None
        return mlx_calls("kimi_k2", body, self.tools)

    def make_id(self, raw: RawCall) -> str:
        return raw.id or super().make_id(raw)
