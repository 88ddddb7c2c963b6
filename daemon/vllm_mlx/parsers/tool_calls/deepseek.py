"""DeepSeek V3 / R1 (0528) and DeepSeek V3.1 tool calls.

V3 and R1 put the type before the separator and fence the JSON arguments:

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
    ```json
    {"city": "Paris"}
    ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>

V3.1 puts the name before the separator and the bare JSON after it:

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}
    <｜tool▁call▁end｜><｜tool▁calls▁end｜>

(wrapped here; the model writes no newline before the call-end marker).

(The bars are U+FF5C and the spaces U+2581, as in DeepSeek's tokenizer.)
"""

from __future__ import annotations

import re

from vllm_mlx.parsers._text import loads, marker_region
from vllm_mlx.parsers.tool_calls.base import RawCall, ToolCallParser

CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALLS_END = "<｜tool▁calls▁end｜>"
CALL_BEGIN = "<｜tool▁call▁begin｜>"
CALL_END = "<｜tool▁call▁end｜>"
SEP = "<｜tool▁sep｜>"

_CALL = re.compile(re.escape(CALL_BEGIN) + r"(.*?)" + re.escape(CALL_END), re.DOTALL)
_FENCED = re.compile(r"\s*([^\n]+?)\s*\n```(?:json)?\s*\n(.*?)\n?```\s*", re.DOTALL)


class DeepSeekToolCallParser(ToolCallParser):
    name = "deepseek"
    start_markers = (CALLS_BEGIN,)

    def find_end(self, text: str, *, final: bool) -> int | None:
        end = marker_region(text, CALLS_END, len(CALLS_BEGIN))
        # R1 sometimes ends the turn without the closing marker; accept it at the end.
        return len(text) if end is None and final else end

    def parse_region(self, region: str) -> list[RawCall] | None:
        body = region.removeprefix(CALLS_BEGIN).removesuffix(CALLS_END)
        if _CALL.sub("", body).strip():
            return None  # unterminated call or stray text inside the section
        calls = [_parse_call(match.group(1)) for match in _CALL.finditer(body)]
        if not calls or any(call is None for call in calls):
            return None
        return [call for call in calls if call is not None]


def _parse_call(text: str) -> RawCall | None:
    head, sep, tail = text.partition(SEP)
    if not sep:
        return None
    fenced = _FENCED.fullmatch(tail)
    if fenced is not None:
        name, arguments = fenced.group(1), fenced.group(2)
    else:
        name, arguments = head.strip(), tail.strip()
    parsed = loads(arguments)
    return None if parsed is None else RawCall(name, parsed)
