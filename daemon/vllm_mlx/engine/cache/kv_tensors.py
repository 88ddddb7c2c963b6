"""K or V of a batch row's cache as the engine's caches (rows.py) hold them: one float
array, or MLX's affine-quantized (packed words, scales, biases) triple, and the array
work on either form."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import mlx.core as mx

# K or V of a batch: one array, or the (packed, scales, biases) triple once quantized.
Tensor = Any


@dataclass(frozen=True)
class KVQuantization:
    """A model's `kv_cache` section as the engine takes it."""

    bits: int
    group_size: int = 64
    quantized_after: int = 0


def each(fn: Callable[[mx.array], mx.array], kv: Tensor) -> Tensor:
    """`fn` on an array, or on each array of a quantized triple."""
    if isinstance(kv, tuple):
        return tuple(fn(x) for x in kv)
    return fn(kv)


def quantize(kv: mx.array, quant: KVQuantization) -> tuple[mx.array, ...]:
    return tuple(mx.quantize(kv, group_size=quant.group_size, bits=quant.bits))


def first(kv: Tensor) -> mx.array:
    return cast(mx.array, kv[0] if isinstance(kv, tuple) else kv)


def ints(array: mx.array) -> list[int]:
    return cast(list[int], array.tolist())


def indices(batch_indices: Any) -> list[int]:
    if isinstance(batch_indices, mx.array):
        return ints(batch_indices)
    return [int(i) for i in batch_indices]


def parts(kv: Tensor) -> list[mx.array]:
    return list(kv) if isinstance(kv, tuple) else [kv]


def row_tensors(row: Any, quant: KVQuantization | None) -> tuple[Tensor, Tensor]:
    """A row's K and V over its own length: quantized when `quant` is given."""
    n = int(row.offset)
    keys = each(lambda x: x[..., :n, :], row.keys)
    values = each(lambda x: x[..., :n, :], row.values)
    if quant is not None and not isinstance(keys, tuple):
        return quantize(keys, quant), quantize(values, quant)
    return keys, values


def right_justified(blocks: Sequence[tuple[Tensor, int, int]], end: int, size: int) -> Tensor:
    """K or V of several blocks of rows stacked in one buffer `size` positions long, each
    block's first `length` positions moved to end at `end` (as mlx-lm's extend lines two
    batches up): `blocks` are (K or V or None for rows without any yet, length, rows).

    One zeroed buffer with each block written into it: mlx-lm pads every block to the
    full length and then concatenates them, two copies of the whole batch cache, and
    when a long prompt joins a batch of short rows that buffer is every row times the
    long row's length (~1.7 GB for 9 rows of the bundled model at 4k positions)."""
    template = next(kv for kv, _, _ in blocks if kv is not None)
    total = sum(rows for _, _, rows in blocks)

    def joined(part: int) -> mx.array:
        like = parts(template)[part]
        buffer = mx.zeros((total, like.shape[1], size, like.shape[3]), like.dtype)
        start = 0
        for kv, length, rows in blocks:
            if kv is not None and length:
                live = parts(kv)[part][..., :length, :]
                buffer[start : start + rows, :, end - length : end, :] = live
            start += rows
        return buffer

    built = [joined(part) for part in range(len(parts(template)))]
    return tuple(built) if isinstance(template, tuple) else built[0]
