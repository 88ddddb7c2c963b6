"""MeetKai Functionary v3.1 (Llama 3.1 based) and v3.2 (``>>>recipient`` turns).

v3.2 starts every part of the answer with ``>>>`` and a recipient: ``all`` for text to
the user, otherwise a function name followed by its JSON arguments. The generation
prompt already ends with ``>>>``, so the first recipient comes without it:

    all
    Let me check.>>>get_weather
    {"city": "Paris"}

v3.1 writes ``<function=get_weather>{"city": "Paris"}</function>``.
"""

from __future__ import annotations

import regex

from vllm_mlx.parsers._text import MALFORMED, loads, regex_step, skip_space
from vllm_mlx.parsers.tool_calls.base import RawCall, Region, ToolCallParser

RECIPIENT = ">>>"
FUNCTION, FUNCTION_END = "<function=", "</function>"
_HEADER = regex.compile(r"(?:>>>)?([A-Za-z_][\w.\-]*)\n")
_FUNCTION = regex.compile(r"<function=([\w.\-]+)>")


class FunctionaryToolCallParser(ToolCallParser):
    name = "functionary"
    start_markers = (RECIPIENT, FUNCTION)
    leading_patterns = (r"[A-Za-z_][\w.\-]*\n",)

    def take_region(self, text: str, *, at_start: bool, final: bool) -> Region | None:
        if text.startswith(FUNCTION):
            return _v31_call(text, final)
        header = regex_step(_HEADER, text, 0, final)
        if header == "wait":
            return None
        if header is None:
            return len(RECIPIENT), None
        if header.group(1) == "all":
            return header.end(), []  # the recipient marker of plain text: drop it
        start = skip_space(text, header.end())
        end = self.scanner.end(text, start)
        if end is None:
            return None
        if end == MALFORMED:
            return header.end(), None
        arguments = loads(text[start:end])
        return end, None if arguments is None else [RawCall(header.group(1), arguments)]


def _v31_call(text: str, final: bool) -> Region | None:
    header = regex_step(_FUNCTION, text, 0, final)
    if header == "wait":
        return None
    if header is None:
        return len(FUNCTION), None
    close = text.find(FUNCTION_END, header.end())
    if close < 0:
        return None
    arguments = loads(text[header.end() : close])
    end = close + len(FUNCTION_END)
    return end, None if arguments is None else [RawCall(header.group(1), arguments)]
