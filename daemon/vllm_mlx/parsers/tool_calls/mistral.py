"""Mistral / Mixtral / Ministral / Mistral Small / Devstral / Magistral tool calls.

Before tokenizer v11 (Mistral 7B v0.3, Nemo, Small 24B 2501) a JSON array follows:

    [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "a1b2c3d4e"}]

From v11 on (Small 3.1/3.2, Devstral, Magistral) each call is a name and its arguments:

    [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{}

Some detokenizers drop the [ARGS] control token (``[TOOL_CALLS]get_weather{...}``) and
some versions add ``[CALL_ID]<id>`` before [ARGS]; both are accepted. There is no
closing marker: a region ends where its JSON closes.
"""

from __future__ import annotations

import secrets
import string

import regex

from vllm_mlx.parsers._text import MALFORMED, BracketScanner, regex_step, skip_space
from vllm_mlx.parsers.tool_calls._shared import mlx_calls
from vllm_mlx.parsers.tool_calls.base import RawCall, Region, ToolCallParser

MARKER = "[TOOL_CALLS]"
_HEADER = regex.compile(r"\s*([\w\-]+)(?:\[CALL_ID\][\w\-]*)?(?:\[ARGS\])?\s*\{")
# A further call without its own [TOOL_CALLS]; [ARGS] is required so that ordinary
# text after a call is not taken for a function name.
_NEXT_HEADER = regex.compile(r"\s*([\w\-]+)(?:\[CALL_ID\][\w\-]*)?\[ARGS\]\s*\{")
_ID_CHARS = string.ascii_letters + string.digits


class MistralToolCallParser(ToolCallParser):
    name = "mistral"
    start_markers = (MARKER,)

    def take_region(self, text: str, *, at_start: bool, final: bool) -> Region | None:
        scanned = _scan(text, final, self.scanner)
        if scanned is None:
            return None
        end, body = scanned
        # mlx-lm's mistral parser reads both the array and the name[ARGS]{...} form.
        return end, None if body is None else mlx_calls("mistral", body, self.tools)

    def make_id(self, raw: RawCall) -> str:
        # Mistral's chat templates reject ids that are not 9 alphanumerics.
        if raw.id and len(raw.id) == 9 and raw.id.isalnum():
            return raw.id
        return "".join(secrets.choice(_ID_CHARS) for _ in range(9))


def _scan(text: str, final: bool, scanner: BracketScanner) -> tuple[int, str | None] | None:
    """(end, body in mlx-lm's syntax or None if malformed); None: wait for more."""
    pos = skip_space(text, len(MARKER))
    if pos == len(text):
        return None
    if text[pos] == "[":
        end = scanner.end(text, pos)
        if end is None:
            return None
        return (len(MARKER), None) if end == MALFORMED else (end, text[pos:end])
    pieces: list[str] = []
    pattern = _HEADER
    while True:
        step = regex_step(pattern, text, pos, final)
        if step == "wait":
            return None
        end = MALFORMED if step is None else scanner.end(text, step.end() - 1)
        if end is None:
            return None
        if end == MALFORMED:
            return (pos, "".join(pieces)) if pieces else (len(MARKER), None)
        pieces.append(f"{step.group(1)}[ARGS]{text[step.end() - 1 : end]}")
        pos, pattern = end, _NEXT_HEADER
