"""Dropping each row's rejected positions from a batch KV cache after a verify pass.

A verify pass writes the same number of positions to every row; row i keeps its first
`keep[i]` of them (its pending token and its accepted drafts). The batch cache has one
write index for all rows and hides only what lies left of each row's `left_padding`, so:

- the batch is trimmed to the longest kept run (`m`): one index move, no copy;
- a row that kept fewer (`m - keep[i]` stale positions at its end) has its positions
  moved right by that much, so the stale ones fall into its left padding, which grows by
  the same amount. Its RoPE offset (`offset = index - left_padding`) then counts exactly
  its real tokens, and the mask hides the stale slots as it hides padding.

Order is kept (the paged prefix cache slices rows by position), and values are copied,
never recomputed, so the row's later steps see the same keys as without speculation.
The copy costs the row's window of K and V in every layer, so it is only done for the
rows that need it, and never at batch size 1 (one row is always the longest). A
quantized batch cache (`kv_cache.bits`) keeps K and V as (words, scales, biases), each
indexed by position like a float array: each of the three moves alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import dynamic_roll

from vllm_mlx.engine.cache.rows import BatchKVCache


def can_rewind(layers: Sequence[Any]) -> bool:
    """Whether every layer is a batch cache (full precision or quantized) this module can
    rewind."""
    return all(isinstance(c, BatchKVCache) for c in layers)


def rewind(layers: Sequence[Any], written: int, keep: Sequence[int]) -> None:
    """Drop positions of the last `written` from each row: row i keeps `keep[i]`."""
    longest = max(keep)
    shifts = [longest - k for k in keep]
    moved = any(shifts)
    lo = 0
    if moved:
        pads = _ints(layers[0].left_padding)
        lo = min(p for p, s in zip(pads, shifts, strict=True) if s)
    by = mx.array(shifts)
    for cache in layers:
        cache.trim(written - longest)
        if not moved:
            continue
        end = cache._idx
        # Only the window from the first moved row's padding on changes; rows that do
        # not move roll by 0 (an identity gather).
        for name in ("keys", "values"):
            stored = getattr(cache, name)
            for part in stored if isinstance(stored, tuple | list) else (stored,):
                part[..., lo:end, :] = dynamic_roll(part[..., lo:end, :], by[:, None], axis=2)
        cache.left_padding = cache.left_padding + by
        cache.offset = cache.offset - by


def _ints(array: mx.array) -> list[int]:
    values: list[int] = array.tolist()  # type: ignore[assignment]
    return values
