"""Volatile client lines out of system text, so per-session metadata keeps the prefix cache.

Claude Code opens its `system` with a billing line whose suffix changes with each
session; every token after it then misses the prefix cache, and each new session pays
a full prefill. Lines that `engine.prompt_canonicalization` matches in full are removed
before templating (docs/caching.md). Only system text is touched, never user content.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache


@lru_cache(maxsize=64)
def _compiled(patterns: tuple[str, ...]) -> tuple[re.Pattern[str], ...]:
    return tuple(re.compile(pattern) for pattern in patterns)


def canonical_system(text: str, patterns: Sequence[str]) -> str:
    """`text` without the lines a pattern matches in full (and the blank edges left)."""
    if not patterns or not text:
        return text
    compiled = _compiled(tuple(patterns))
    lines = text.split("\n")
    kept = [line for line in lines if not any(p.fullmatch(line) for p in compiled)]
    if len(kept) == len(lines):
        return text
    return "\n".join(kept).strip("\n")
