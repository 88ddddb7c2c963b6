"""CPU-heavy request work off the event loop: parsing bodies, templates, tokenising.

A 9 MB prompt takes seconds to tokenise and a client's chat template can loop; on the
event loop either would stall every other request, /health included. Both run in a
small pool of worker threads with a time bound; the size bounds come earlier
(`limits.max_body_mb` in the middleware, `limits.max_prompt_chars` in `check_text`).
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
from collections.abc import Callable
from typing import Any, TypeVar

from vllm_mlx.api.errors import APIError, bad_request
from vllm_mlx.api.pipeline.turn import Target
from vllm_mlx.api.pipeline.workers import Workers
from vllm_mlx.metrics.core import Metrics

T = TypeVar("T")

WORKERS = 4  # bounds the CPU a burst of huge prompts (or slow templates) can take
MAX_DEPTH = 100  # JSON nesting: tool schemas need a few dozen levels, nothing needs more
_SURROGATE = re.compile("[\ud800-\udfff]")

# Threads start on first use; one pool per process, shared by every request.
_POOL = Workers(WORKERS, "vllm-mlx-prepare")


def _counted(metrics: Metrics | None, fn: Callable[[], T]) -> T:
    if metrics is None:
        return fn()
    with metrics.prompts_preparing.track_inprogress():
        return fn()


async def off_loop(
    fn: Callable[..., T], *args: Any, limit_s: float, metrics: Metrics | None = None
) -> T:
    """fn(*args) in a worker thread; 413 when it takes longer than `limit_s` seconds.

    A thread cannot be stopped: one that overruns finishes in the background, and the
    pool's size bounds how many can.
    """
    future = _POOL.submit(functools.partial(_counted, metrics, functools.partial(fn, *args)))
    try:
        # asyncio.timeout, not wait_for: wait_for on 3.11 can swallow a cancellation.
        async with asyncio.timeout(limit_s):
            result: T = await asyncio.wrap_future(future)
        return result
    except TimeoutError:
        raise APIError(
            413,
            f"Preparing the prompt took longer than limits.prompt_timeout ({limit_s:g} s).",
            "too_large",
            code="prompt_too_large",
        ) from None


async def prompt_tokens(target: Target, fn: Callable[..., T], *args: Any) -> T:
    """A prompt (or several) rendered and tokenised by fn(*args) in a worker thread."""
    limit_s = target.settings.limits.prompt_timeout
    return await off_loop(fn, *args, limit_s=limit_s, metrics=target.metrics)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _loc(path: tuple[str | int, ...]) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")


def check_text(payload: Any, max_chars: int) -> None:
    """Nesting depth, total characters and lone surrogates of a parsed JSON body.

    Iterative, so no depth of nesting can overflow the stack; one pass over every
    string, key or value, so nothing escapes the character bound.
    """
    total = 0
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(payload, ())]
    while stack:
        value, path = stack.pop()
        if len(path) > MAX_DEPTH:
            raise bad_request(f"the request body nests deeper than {MAX_DEPTH} levels")
        if isinstance(value, dict):
            for key, item in value.items():
                stack.append((key, path))  # keys are text too
                stack.append((item, (*path, key)))
        elif isinstance(value, list):
            stack.extend((item, (*path, index)) for index, item in enumerate(value))
        elif isinstance(value, str):
            total += len(value)
            if not value.isascii() and _SURROGATE.search(value):
                param = _loc(path) or None
                raise bad_request(
                    f"'{param}' contains a lone UTF-16 surrogate, which is not valid Unicode",
                    param,
                )
    if total > max_chars:
        raise APIError(
            413,
            f"The request carries {total} characters of text, more than "
            f"limits.max_prompt_chars ({max_chars}).",
            "too_large",
            code="prompt_too_large",
        )


def parse_json(raw: bytes, max_chars: int) -> dict[str, Any]:
    """The body as a JSON object, checked by check_text; malformed bodies are a 400."""
    try:
        payload = json.loads(raw, parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
        raise bad_request(f"the request body is not valid JSON: {exc}") from exc
    except RecursionError:
        raise bad_request(f"the request body nests deeper than {MAX_DEPTH} levels") from None
    if not isinstance(payload, dict):
        raise bad_request("the request body must be a JSON object")
    check_text(payload, max_chars)
    return payload
