"""Text scanning helpers shared by the streaming parsers.

Every decision here depends only on the text seen so far, never on how it was split
into chunks: that is what makes feeding token by token give the same result as
parsing the whole output at once.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

# `regex` (a dependency of transformers and mlx-lm's own parsers) supports partial
# matching: it tells us when the text ends in the middle of a possible marker.
import regex

MALFORMED = -1
"""Returned by scanners when the text can never become what they look for."""

_OPENERS = {"{": "}", "[": "]", "(": ")"}
_SIGNIFICANT = regex.compile(r"[\\\"'(){}\[\]]")


def balanced_end(text: str, pos: int, quotes: str = '"') -> int | None:
    """Index just past the bracket that closes the one at ``pos``.

    None while the text ends before the closer; MALFORMED when ``text[pos]`` is not
    an opening bracket or a closer does not match. Brackets inside strings (quoted
    with any of ``quotes``) are ignored, backslash escapes included.
    """
    return BracketScanner().end(text, pos, quotes)


@dataclass
class _Scan:
    text: str
    at: int
    stack: list[str] = field(default_factory=list)
    quote: str = ""
    skip: int = -1
    result: int | None = None


class BracketScanner:
    """balanced_end that resumes where it stopped when called again on a longer text.

    A streaming region is rescanned after every token until it closes; resuming keeps
    that linear, not quadratic, in the length of a call's arguments.
    """

    def __init__(self) -> None:
        self._scans: dict[tuple[int, str], _Scan] = {}

    def end(self, text: str, pos: int, quotes: str = '"') -> int | None:
        scan = self._scans.get((pos, quotes))
        if scan is None or not text.startswith(scan.text):
            if pos >= len(text):
                return None
            if text[pos] not in _OPENERS:
                return MALFORMED
            if len(self._scans) >= 16:
                self._scans.clear()  # old regions' scans; a region uses only a few
            scan = self._scans[(pos, quotes)] = _Scan(text, pos)
        if scan.result is None:
            scan.result = _advance(scan, text, quotes)
            scan.text, scan.at = text, len(text)
        return scan.result


def _advance(scan: _Scan, text: str, quotes: str) -> int | None:
    for match in _SIGNIFICANT.finditer(text, scan.at):
        at, char = int(match.start()), match.group()
        if at == scan.skip:
            continue
        if scan.quote:
            if char == "\\":
                scan.skip = at + 1
            elif char == scan.quote:
                scan.quote = ""
        elif char in quotes:
            scan.quote = char
        elif char in _OPENERS:
            scan.stack.append(_OPENERS[char])
        elif char in ")]}":
            if not scan.stack or scan.stack.pop() != char:
                return MALFORMED
            if not scan.stack:
                return at + 1
    return None


def skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def marker_region(text: str, end_marker: str, start: int = 1) -> int | None:
    """Index just past the first ``end_marker`` at or after ``start``, else None."""
    found = text.find(end_marker, start)
    return None if found < 0 else found + len(end_marker)


def strip_markers(region: str, start_marker: str, end_marker: str = "") -> str:
    body = region.removeprefix(start_marker)
    if end_marker:
        body = body.removesuffix(end_marker)
    return body.strip()


def loads(text: str) -> Any:
    """Parse JSON, returning None (never raising) when the text is not JSON."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


@dataclass(frozen=True)
class StartPatterns:
    """Where tool-call regions may begin.

    ``anywhere`` patterns may match at any point of the content; ``leading`` ones only
    at the very start of the output (after whitespace), for formats whose calls are
    bare JSON or Python that would be ambiguous in the middle of prose.
    """

    anywhere: tuple[Any, ...]
    leading: tuple[Any, ...]

    @classmethod
    def build(
        cls, markers: Sequence[str], patterns: Sequence[str], leading: Sequence[str]
    ) -> StartPatterns:
        return cls(
            anywhere=tuple(regex.compile(regex.escape(m)) for m in markers)
            + tuple(regex.compile(p) for p in patterns),
            leading=tuple(regex.compile(p) for p in leading),
        )

    def find(self, text: str, *, at_start: bool, final: bool) -> tuple[int, int]:
        """(start, safe): a region starts at ``start`` (-1: none yet); text before
        ``safe`` cannot be part of a region and may be emitted as content."""
        start, partial = -1, len(text)
        for pattern in self.anywhere:
            match = pattern.search(text, partial=not final)
            start, partial = _merge(match, start, partial)
        if at_start:
            lead = skip_space(text, 0)
            for pattern in self.leading:
                match = pattern.match(text, lead, partial=not final)
                start, partial = _merge(match, start, partial)
        # A possible longer marker at the same place must be resolved first.
        if start >= 0 and start < partial:
            return start, start
        return -1, partial


def _merge(match: Any, start: int, partial: int) -> tuple[int, int]:
    if match is None:
        return start, partial
    if match.partial:
        # An empty partial match at the very end holds nothing back.
        return start, min(partial, match.start())
    if start < 0 or match.start() < start:
        start = match.start()
    return start, partial


def regex_step(pattern: Any, text: str, pos: int, final: bool) -> Any:
    """Match ``pattern`` at ``pos``: the match, None (no match), or "wait" when the
    text ends inside a possible match and more may come."""
    match = pattern.match(text, pos, partial=not final)
    if match is not None and match.partial:
        return "wait"
    return match


class WhitespaceTrim:
    """Drops whitespace at the start and end of a text stream and around tool calls.

    Trailing whitespace is held back until more text shows it was not trailing, so the
    streamed text equals ``"".join(parts).strip()`` with calls collapsed out.
    """

    def __init__(self) -> None:
        self._held = ""
        self._drop_leading = True

    def push(self, text: str) -> str:
        if self._drop_leading:
            text = text.lstrip()
            if not text:
                return ""
            self._drop_leading = False
        text = self._held + text
        body = text.rstrip()
        self._held = text[len(body) :]
        return body

    def boundary(self) -> None:
        """A call was cut out here: whitespace right after it is not content."""
        self._drop_leading = True
