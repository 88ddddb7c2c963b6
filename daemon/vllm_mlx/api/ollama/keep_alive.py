"""Ollama's per-request `keep_alive`: how long the model stays loaded after the request.

A number of seconds or a Go duration string ("5m", "1h30m", "300ms"); negative keeps
the model loaded for good and 0 unloads it once the request ends. The daemon applies
it through ModelManager.keep_alive_after (engine/fleet/residency.py); docs/ollama.md.
"""

from __future__ import annotations

import math
import re

from vllm_mlx.api.errors import bad_request
from vllm_mlx.config.model import MAX_KEEP_ALIVE_S

FOREVER = -1.0
_NUMBER = re.compile(r"\d+(?:\.\d*)?|\.\d+")
_DURATION = re.compile(rf"({_NUMBER.pattern})(ns|us|µs|ms|s|m|h)")
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_keep_alive(keep_alive: float | str | None) -> float | None:
    """Seconds (None: not given, the config's applies; -1: never unload).

    Beyond a year means for good (as the config's `keep_alive` range says), which also
    keeps an absurd value from reaching the event loop's timer."""
    if keep_alive is None:
        return None
    seconds = _seconds(keep_alive) if isinstance(keep_alive, str) else float(keep_alive)
    if math.isnan(seconds):
        raise bad_request(f"keep_alive {keep_alive!r} is not a duration", "keep_alive")
    if seconds < 0 or seconds > MAX_KEEP_ALIVE_S:
        return FOREVER
    return seconds


def _seconds(text: str) -> float:
    stripped = text.strip()
    sign = -1.0 if stripped.startswith("-") else 1.0
    body = stripped[1:] if stripped[:1] in "+-" else stripped
    if _NUMBER.fullmatch(body):
        return sign * float(body)  # a bare number of seconds, as a string
    parts = _DURATION.findall(body)
    if not body or "".join(n + u for n, u in parts) != body:
        raise bad_request(f"keep_alive {text!r} is not a duration", "keep_alive")
    return sign * sum(float(n) * _UNITS[u] for n, u in parts)
