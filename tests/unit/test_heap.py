"""glibc's heap hands freed memory back to the OS (engine/heap.py)."""

from __future__ import annotations

import ctypes
import sys

import pytest

from vllm_mlx.engine.fleet import heap


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")
def test_the_mmap_threshold_is_fixed_and_freed_blocks_go_back() -> None:
    assert heap.keep_large_allocations_returnable()
    libc = heap._libc()
    assert libc is not None
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    # Freed blocks (here 64 MiB, touched so they count) leave RSS once released.
    import psutil

    process = psutil.Process()
    blocks = [libc.malloc(4 * 2**20) for _ in range(16)]
    for block in blocks:
        ctypes.memset(block, 1, 4 * 2**20)  # touch the pages so they count in RSS
    touched = process.memory_info().rss
    for block in blocks:
        libc.free(block)
    heap.release_free_memory()
    assert process.memory_info().rss < touched - 48 * 2**20


def test_off_glibc_both_calls_are_harmless(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(heap, "_libc", lambda: None)
    assert heap.keep_large_allocations_returnable() is False
    heap.release_free_memory()
