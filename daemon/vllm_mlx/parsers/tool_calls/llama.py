"""Meta Llama 3.1 / 3.2 / 3.3 (JSON) and Llama 4 (pythonic list) tool calls.

Llama 3.x answers a tool request with the whole message as JSON, sometimes after
``<|python_tag|>``, several calls separated by ``;``:

    {"name": "get_weather", "parameters": {"city": "Paris"}}

Llama 4 writes a Python list of calls, sometimes wrapped in python_start/end:

    [get_weather(city="Paris"), get_time(timezone="Europe/Paris")]

Bare JSON and bare lists count only at the start of the output: in the middle of an
answer they are far more likely to be an example than a call.
"""

from __future__ import annotations

import regex

from vllm_mlx.parsers._text import MALFORMED, loads, regex_step, skip_space
from vllm_mlx.parsers.tool_calls._shared import json_calls, mlx_calls
from vllm_mlx.parsers.tool_calls.base import RawCall, Region, ToolCallParser

PYTHON_TAG = "<|python_tag|>"
PYTHON_START, PYTHON_END = "<|python_start|>", "<|python_end|>"
_NEXT_JSON = regex.compile(r"\s*;?\s*\{")
_PYTHON_END = regex.compile(r"\s*" + regex.escape(PYTHON_END))


class LlamaToolCallParser(ToolCallParser):
    name = "llama"
    start_markers = (PYTHON_TAG, PYTHON_START)
    leading_patterns = (r"\{\s*\"", r"\[\s*[A-Za-z_][\w.]*\s*\(")

    def take_region(self, text: str, *, at_start: bool, final: bool) -> Region | None:
        if text.startswith(PYTHON_START):
            return self._pythonic(text, skip_space(text, len(PYTHON_START)), final, True)
        if text.startswith("["):
            return self._pythonic(text, 0, final, False)
        pos = skip_space(text, len(PYTHON_TAG)) if text.startswith(PYTHON_TAG) else 0
        return self._json_sequence(text, pos, final)

    def _json_sequence(self, text: str, pos: int, final: bool) -> Region | None:
        objects: list[str] = []
        start, end = pos, pos
        while True:
            close = self.scanner.end(text, start)
            if close is None:
                return None
            if close == MALFORMED:
                break
            objects.append(text[start:close])
            end = close
            step = regex_step(_NEXT_JSON, text, end, final)
            if step == "wait":
                return None
            if step is None:
                break
            start = step.end() - 1
        if not objects:
            return pos, None
        calls: list[RawCall] = []
        for item in objects:
            found = json_calls(loads(item), ("parameters", "arguments"))
            if found is None:
                return end, None
            calls.extend(found)
        return end, calls

    def _pythonic(self, text: str, pos: int, final: bool, wrapped: bool) -> Region | None:
        end = self.scanner.end(text, pos, quotes="\"'")
        if end is None:
            return None
        if end == MALFORMED:
            return pos, None
        body = text[pos:end]
        if wrapped:
            step = regex_step(_PYTHON_END, text, end, final)
            if step == "wait":
                return None
            if step is not None:
                end = step.end()
        # mlx-lm's pythonic parser evaluates the list with ast, safely.
        return end, mlx_calls("pythonic", body, self.tools)
