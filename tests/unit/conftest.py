"""Fixtures shared by the unit tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.kernel import isas
from vllm_mlx.models.cpu import qmm


@pytest.fixture(params=isas())
def isa(request: pytest.FixtureRequest) -> Iterator[str]:
    """Each instruction set of the quantized CPU extension in turn (none when unbuilt)."""
    qmm.extension().set_isa(request.param)
    yield request.param
    qmm.extension().set_isa("best")


@pytest.fixture
def threaded() -> Iterator[None]:
    """Two threads on any work, so the pool splits even small calls (attention kernels)."""
    ext = qmm.extension()
    threads, parallel_min = ext.threads(), ext.parallel_min()
    ext.set_threads(2)
    ext.set_parallel_min(0)
    yield
    ext.set_threads(threads)
    ext.set_parallel_min(parallel_min)


@pytest.fixture
def threads() -> Iterator[None]:
    """Restores the kernel defaults a test changed: threads, the split threshold, the
    prefetch distance, the ISA."""
    if not qmm.status().available:
        yield
        return
    ext = qmm.extension()
    parallel_min, prefetch = ext.parallel_min(), ext.prefetch_distance()
    yield
    qmm.set_threads(2)
    ext.set_parallel_min(parallel_min)
    ext.set_prefetch_distance(prefetch)
    ext.set_isa("best")
