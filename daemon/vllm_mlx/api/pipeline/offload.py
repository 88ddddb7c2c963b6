"""CPU-heavy request work off the event loop: parsing bodies, templates, tokenising.

A 9 MB prompt takes seconds to tokenise and a client's chat template can loop; on the
event loop either would stall every other request, /health included. Both run in a
small pool of worker threads with a time bound; the size bounds come earlier
(`limits.max_body_mb` in the middleware, `limits.max_prompt_chars` in `check_text`).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Any, TypeVar

from vllm_mlx.api.errors import APIError
from vllm_mlx.api.pipeline.workers import Workers
from vllm_mlx.metrics.core import Metrics

T = TypeVar("T")

WORKERS = 4  # bounds the CPU a burst of huge prompts (or slow templates) can take

# Threads start on first use; one pool per process, shared by every request.
_POOL = Workers(WORKERS, "vllm-mlx-prepare")


def _counted(metrics: Metrics | None, fn: Callable[[], T]) -> T:
    if metrics is None:
        return fn()
    with metrics.prompts_preparing.track_inprogress():
        return fn()


async def in_worker(fn: Callable[..., T], *args: Any, metrics: Metrics | None = None) -> T:
    """fn(*args) in a worker thread; the caller bounds the wait (asyncio.timeout).

    A thread cannot be stopped: one that overruns finishes in the background, and the
    pool's size bounds how many can.
    """
    future = _POOL.submit(functools.partial(_counted, metrics, functools.partial(fn, *args)))
    result: T = await asyncio.wrap_future(future)
    return result


async def off_loop(
    fn: Callable[..., T], *args: Any, limit_s: float, metrics: Metrics | None = None
) -> T:
    """fn(*args) in a worker thread; 413 when it takes longer than `limit_s` seconds."""
    try:
        # asyncio.timeout, not wait_for: wait_for on 3.11 can swallow a cancellation.
        async with asyncio.timeout(limit_s):
            return await in_worker(fn, *args, metrics=metrics)
    except TimeoutError:
        raise APIError(
            413,
            f"Preparing the prompt took longer than limits.prompt_timeout ({limit_s:g} s).",
            "too_large",
            code="prompt_too_large",
        ) from None
