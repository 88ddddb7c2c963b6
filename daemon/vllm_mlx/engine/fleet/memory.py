"""Memory readings for /v1/status and /metrics, kept here so api/ never imports mlx."""

from __future__ import annotations

import os
from dataclasses import dataclass

import mlx.core as mx
import psutil


@dataclass(frozen=True)
class MemoryReading:
    active_bytes: int
    peak_bytes: int
    cache_bytes: int
    rss_bytes: int


def read_memory() -> MemoryReading:
    """MLX allocator numbers (every backend: Metal, CUDA, CPU) plus the process RSS.

    The top-level mx.get_*_memory functions exist on every backend; the older
    mx.metal.* spellings only on macOS, so they are never used.
    """
    return MemoryReading(
        active_bytes=int(mx.get_active_memory()),
        peak_bytes=int(mx.get_peak_memory()),
        cache_bytes=int(mx.get_cache_memory()),
        rss_bytes=int(psutil.Process(os.getpid()).memory_info().rss),
    )
