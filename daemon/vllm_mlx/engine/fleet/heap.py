"""Give freed memory back to the OS (glibc): RSS follows what the daemon really holds.

MLX's CPU backend allocates its arrays with malloc. glibc serves a large allocation
with mmap (returned to the OS on free) only above a threshold that it raises by itself
each time such a block is freed, up to 32 MiB: after a few freed KV caches every
later cache comes from the heap, and freed heap memory mostly stays in the process.
A 10-minute soak grew RSS to 2.6 GB while MLX held 0.7 GB. Fixing the threshold stops
the drift, and trimming when the engine goes idle hands back what fragmentation kept.
Elsewhere (macOS, musl) both calls are no-ops.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from functools import cache

M_MMAP_THRESHOLD = -3  # mallopt parameter numbers from glibc's malloc.h
MMAP_THRESHOLD_BYTES = 256 * 1024


@cache
def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt  # noqa: B018 - glibc only: musl has neither call
        libc.malloc_trim  # noqa: B018
    except (OSError, AttributeError):
        return None
    return libc


def keep_large_allocations_returnable() -> bool:
    """Fix glibc's mmap threshold (so it no longer grows); True when applied."""
    libc = _libc()
    return bool(libc is not None and libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1)


def release_free_memory() -> None:
    """Return free heap pages to the OS (cheap when there is little to return)."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)
