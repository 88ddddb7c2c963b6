"""The load-time check of every swap in this package: the swapped call against the
original on random inputs, bit for bit, before a model serves with it."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import mlx.core as mx

# (swapped output, original output) pairs, computed as the iterator is consumed.
Pairs = Callable[[], Iterator[tuple[mx.array, mx.array]]]


def same_bits(pairs: Pairs) -> bool:
    """Whether every pair is bit-identical; False on the first that is not, or on any
    error (a layout the probe cannot feed): keep the original path, never fail the load."""
    try:
        return all(mx.array_equal(got, want).item() for got, want in pairs())
    except Exception:
        return False
