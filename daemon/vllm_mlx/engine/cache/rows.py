"""The KV cache a batch row lives in: full precision or quantized, and tagged.

mlx-lm's BatchGenerator builds each batch's per-layer cache from the rows' own caches
(`merge`), grows it as rows join (`extend`), shrinks it as rows leave (`filter`) and
hands a finished row's cache back (`extract`), in the prompt batch and the decode batch
alike. Two things ride on that bookkeeping here:

- **Quantization of the live cache** (a model's `kv_cache.bits`). mlx-lm quantizes the
  cache of one sequence (`QuantizedKVCache`), but its batch cache has no quantized form:
  `BatchKVCache` below keeps K and V as MLX's affine-quantized triples (packed words,
  scales, biases) once the batch's longest row reaches `quantized_after` tokens, and
  mlx_lm's attention takes its quantized path for it (`quantized_scaled_dot_product_
  attention`, chosen by `hasattr(cache, "bits")`). Before that it is mlx-lm's
  `BatchKVCache` exactly.
- **A tag per row** (the LoRA adapter a row runs under). The tags stay aligned with the
  rows through every merge, extend and filter, so a model wrapper can read which rows
  the current forward pass computes from `cache_tags(cache)`.

A join (`extend`) writes every row once into one buffer with room for the next step
(kv_tensors.right_justified), where mlx-lm copies the whole batch twice, then again.

The decision to quantize is per batch: a short row that joins a quantized batch is
quantized with it. With `quantized_after: 0` (the default) every row is quantized from
its first token, so a row's output never depends on which rows it shares a batch with.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any, cast

import mlx.core as mx
from mlx_lm.models import cache as mlx_cache
from mlx_lm.models.cache import KVCache, QuantizedKVCache, dynamic_roll

from vllm_mlx.engine.cache.kv_tensors import (
    KVQuantization,
    Tensor,
    each,
    first,
    indices,
    ints,
    parts,
    quantize,
    right_justified,
    row_tensors,
)

__all__ = [
    "BatchKVCache",
    "KVQuantization",
    "QuantizedRowKVCache",
    "RowKVCache",
    "cache_tags",
    "row_caches",
]


class RowKVCache(KVCache):
    """One sequence's full-precision cache, as mlx-lm's, with the row's tag and its
    model's quantization (so `merge` can build the batch without other context)."""

    def __init__(
        self, tag: Hashable = None, quant: KVQuantization | None = None, reserve: int = 0
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.tag = tag
        self.quant = quant
        self.reserve = reserve  # the positions the row holds once its prompt is read

    def merge(self, caches: Sequence[Any]) -> BatchKVCache:  # type: ignore[override]
        return BatchKVCache.from_rows(caches, self.quant)


class QuantizedRowKVCache(QuantizedKVCache):
    """One sequence's quantized cache (a finished row's, kept by the prefix cache)."""

    def __init__(
        self, tag: Hashable = None, quant: KVQuantization | None = None, bits: int = 8
    ) -> None:
        group_size = quant.group_size if quant is not None else 64
        super().__init__(group_size=group_size, bits=quant.bits if quant is not None else bits)
        self.tag = tag
        self.quant = quant

    def merge(self, caches: Sequence[Any]) -> BatchKVCache:
        return BatchKVCache.from_rows(caches, self.quant)


def row_caches(
    layers: list[Any],
    tag: Hashable = None,
    quant: KVQuantization | None = None,
    reserve: int = 0,
) -> list[Any]:
    """A row's per-layer caches as this module's kinds, carrying `tag` and `quant`, and
    `reserve`: the positions the row will hold once its prompt is read (its full-precision
    batch grows to that at once, not chunk by chunk).

    Plain KV layers (fresh from make_prompt_cache, or a prefix-cache hit) become row
    caches; a full-precision one already past `quantized_after` is quantized now.
    Sliding-window and state-space layers stay as they are (they are not quantized).
    """
    out: list[Any] = []
    for layer in layers:
        if isinstance(layer, QuantizedKVCache):
            row: Any = QuantizedRowKVCache(tag, quant, bits=layer.bits)
            row.group_size = layer.group_size
        elif type(layer) in (KVCache, RowKVCache):
            if (
                quant is not None
                and layer.keys is not None
                and layer.offset >= quant.quantized_after
            ):
                row = QuantizedRowKVCache(tag, quant)
                row.keys = quantize(layer.keys[..., : layer.offset, :], quant)
                row.values = quantize(layer.values[..., : layer.offset, :], quant)
                row.offset = layer.offset
                out.append(row)
                continue
            row = RowKVCache(tag, quant, reserve)
        else:
            out.append(layer)
            continue
        row.keys, row.values, row.offset = layer.keys, layer.values, layer.offset
        out.append(row)
    return out


def cache_tags(cache: Sequence[Any]) -> list[Hashable] | None:
    """The tags of a forward pass's rows, from the first layer that keeps them."""
    for layer in cache:
        tags = getattr(layer, "tags", None)
        if tags is not None:
            return cast(list[Hashable], tags)
    return None


class BatchKVCache(mlx_cache.BatchKVCache):
    """mlx-lm's batch cache, with row tags, and quantized once its rows are long enough."""

    def __init__(
        self,
        left_padding: list[int],
        tags: Sequence[Hashable] | None = None,
        quant: KVQuantization | None = None,
    ) -> None:
        super().__init__(left_padding)
        self.tags: list[Hashable] = list(tags) if tags is not None else [None] * len(left_padding)
        self.quant = quant
        self.quantized = False
        # Positions the batch's buffers grow to at once when a prompt chunk needs room: the
        # end of its longest prompt (see _room_for_the_prompts); 0: mlx-lm's steps.
        self.reserve = 0

    # mlx_lm's attention takes the quantized path when the cache has `bits`: only once
    # K and V really are quantized.
    @property
    def bits(self) -> int:
        if not self.quantized or self.quant is None:
            raise AttributeError("bits")
        return self.quant.bits

    @property
    def group_size(self) -> int:
        if not self.quantized or self.quant is None:
            raise AttributeError("group_size")
        return self.quant.group_size

    # --- building ------------------------------------------------------------------

    @classmethod
    def from_rows(cls, rows: Sequence[Any], quant: KVQuantization | None) -> BatchKVCache:
        """The batch of these rows' caches, left-padded to the longest."""
        lengths = [int(r.offset) if r.keys is not None else 0 for r in rows]
        tags = [getattr(r, "tag", None) for r in rows]
        longest = max(lengths, default=0)
        padding = [longest - n for n in lengths]
        batch = cls(padding, tags, quant)
        batch.reserve = max(
            (pad + getattr(r, "reserve", 0) for pad, r in zip(padding, rows, strict=True)),
            default=0,
        )
        if longest == 0:
            return batch
        quantize = quant is not None and (
            longest >= quant.quantized_after or any(isinstance(r, QuantizedKVCache) for r in rows)
        )
        tensors = {
            i: row_tensors(r, quant if quantize else None)
            for i, r in enumerate(rows)
            if r.keys is not None
        }
        found = [(tensors.get(i), n) for i, n in enumerate(lengths)]
        batch.keys, batch.values = (
            right_justified(
                [(None if kv is None else kv[side], n, 1) for kv, n in found], longest, longest
            )
            for side in (0, 1)
        )
        batch.quantized = quantize
        batch.offset = batch.offset + longest
        batch._idx = longest
        return batch

    # --- mlx-lm's cache protocol -------------------------------------------------------

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[Tensor, Tensor]:
        if not self.quantized:
            self._room_for_the_prompts(keys, values)
            fetched: tuple[Tensor, Tensor] = super().update_and_fetch(keys, values)  # type: ignore[no-untyped-call]
            if self.quant is None or self._idx < self.quant.quantized_after:
                return fetched
            self._quantize_all()
            return self.keys_and_values()
        assert self.quant is not None
        prev, n = self._idx, keys.shape[2]
        if self.keys is None or prev + n > first(self.keys).shape[2]:
            self._grow(keys, values)
        q_keys, q_values = quantize(keys, self.quant), quantize(values, self.quant)
        stored = cast(tuple[tuple[mx.array, ...], tuple[mx.array, ...]], (self.keys, self.values))
        for target, new in zip(stored, (q_keys, q_values), strict=True):
            for part, piece in zip(target, new, strict=True):
                part[..., prev : prev + n, :] = piece
        self.offset = self.offset + n
        self._idx += n
        return self.keys_and_values()

    def _room_for_the_prompts(self, keys: mx.array, values: mx.array) -> None:
        """Where a chunk does not fit and the prompts go further (`reserve`), grow the
        buffers to the prompts' end once. mlx-lm grows by the chunk (rounded up to 256
        positions), copying the whole cache each time: for a 4k-token prompt read in
        512-token chunks, 8 copies of a growing cache; in the 4-16-token chunks paced
        beside decoding streams, 16 copies, each one a step that stalls them."""
        needed = self._idx + keys.shape[2]
        capacity = 0 if self.keys is None else first(self.keys).shape[2]
        if needed <= capacity or self.reserve <= needed:
            return
        size = (self.reserve + self.step - 1) // self.step * self.step
        used = self._idx

        def grown(old: Any, new: mx.array) -> mx.array:
            shape = (new.shape[0], new.shape[1], size, new.shape[3])
            buffer = mx.zeros(shape, new.dtype)
            if old is not None and used:
                buffer[..., :used, :] = old[..., :used, :]
            return buffer

        self.keys = cast(Any, grown(self.keys, keys))  # mlx_lm types them None
        self.values = cast(Any, grown(self.values, values))

    # --- one decode step's K and V written in place (models/cpu/decoder.py) -------------

    def decode_slot(self) -> int | None:
        """The position one more step's K and V take in the float buffers, where a single
        node may write them there and read them back (what update_and_fetch would do),
        or None: no buffer yet or no room left, quantized now or from this step on, a
        prompt's right padding not yet rolled away."""
        keys = self.keys
        if self.quantized or keys is None or self._right_padding is not None:
            return None
        if self.quant is not None and self._idx + 1 >= self.quant.quantized_after:
            return None
        assert isinstance(keys, mx.array)
        if keys.dtype != mx.float32 or self._idx >= keys.shape[2]:
            return None
        return int(self._idx)

    def commit_decode(self, keys: mx.array, values: mx.array) -> None:
        """The buffers with that step's K and V written at decode_slot()."""
        self.keys, self.values = cast(Any, keys), cast(Any, values)  # mlx_lm types them None
        self.offset = self.offset + 1
        self._idx += 1

    def keys_and_values(self) -> tuple[Tensor, Tensor]:
        end = self._idx
        return (
            each(lambda x: x[..., :end, :], self.keys),
            each(lambda x: x[..., :end, :], self.values),
        )

    def finalize(self) -> None:
        if self._right_padding is None:
            return
        padding = self._right_padding
        self.keys = each(lambda x: dynamic_roll(x, padding[:, None], axis=2), self.keys)
        self.values = each(lambda x: dynamic_roll(x, padding[:, None], axis=2), self.values)
        self.offset = self.offset - padding
        self.left_padding += padding
        self._right_padding = None

    def filter(self, batch_indices: Any) -> None:
        self.tags = [self.tags[int(i)] for i in indices(batch_indices)]
        if self.keys is not None:
            self.keys = each(lambda x: x[batch_indices], self.keys)
            self.values = each(lambda x: x[batch_indices], self.values)
        self.offset = self.offset[batch_indices]
        self.left_padding = self.left_padding[batch_indices]
        shift = min(ints(self.left_padding), default=0)
        if shift > 0:  # the rows left: drop the padding every row now has
            if self.keys is not None:
                self.keys = each(lambda x: x[..., shift:, :], self.keys)
                self.values = each(lambda x: x[..., shift:, :], self.values)
            self._idx -= shift
            self.left_padding -= shift
            self.reserve = max(0, self.reserve - shift)

    def extend(self, other: Any) -> None:
        other = _as_batch(other, self.quant)
        self.tags = self.tags + other.tags
        # Each batch's rows end up at `end`: their prompts' end moves with them.
        end = max(self._idx, other._idx)
        self.reserve = max(b.reserve + end - b._idx for b in (self, other))
        if self.keys is None and other.keys is None:
            self.left_padding = mx.concatenate([self.left_padding, other.left_padding])
            self.offset = mx.concatenate([self.offset, other.offset])
            return
        if self.quantized != other.quantized:  # one form for the whole batch
            for batch in (self, other):
                if not batch.quantized:
                    batch._quantize_all()
        # Room for the next decode step's K and V: a buffer just `end` long would be copied
        # whole again by the first step after the join to grow by mlx-lm's 256 positions.
        room = (end // self.step + 1) * self.step
        size = max([room] + [first(b.keys).shape[2] for b in (self, other) if b.keys is not None])
        batches = (self, other)
        rows = [int(b.offset.shape[0]) for b in batches]
        self.keys = right_justified(
            [(b.keys, b._idx, n) for b, n in zip(batches, rows, strict=True)], end, size
        )
        self.values = right_justified(
            [(b.values, b._idx, n) for b, n in zip(batches, rows, strict=True)], end, size
        )
        self.offset = mx.concatenate([self.offset, other.offset])
        self.left_padding = mx.concatenate([b.left_padding + (end - b._idx) for b in batches])
        self.quantized = self.quantized or other.quantized
        self._idx = end

    def extract(self, idx: int) -> Any:
        mx.eval(self.left_padding)
        pad = ints(self.left_padding)[idx]
        end = self._idx
        row: Any
        if self.quantized:
            assert self.quant is not None
            row = QuantizedRowKVCache(self.tags[idx], self.quant)
        else:
            row = RowKVCache(self.tags[idx], self.quant)
        row.keys = each(lambda x: mx.contiguous(x[idx : idx + 1, :, pad:end]), self.keys)
        row.values = each(lambda x: mx.contiguous(x[idx : idx + 1, :, pad:end]), self.values)
        row.offset = end - pad
        return row

    @classmethod
    def merge(cls, caches: Sequence[Any]) -> BatchKVCache:  # type: ignore[override]
        quant = next((c.quant for c in caches if getattr(c, "quant", None) is not None), None)
        return cls.from_rows(caches, quant)

    @property
    def nbytes(self) -> int:
        if self.keys is None:
            return 0
        arrays = [*parts(self.keys), *parts(self.values)]
        return sum(int(a.nbytes) for a in arrays)

    # --- quantization ------------------------------------------------------------------

    def _quantize_all(self) -> None:
        assert self.quant is not None
        if self.keys is not None:
            self.keys = quantize(self.keys, self.quant)
            self.values = quantize(self.values, self.quant)
        self.quantized = True

    def _grow(self, keys: mx.array, values: mx.array) -> None:
        """Room for the incoming positions, in mlx-lm's steps of 256."""
        assert self.quant is not None
        n, prev = keys.shape[2], self._idx
        steps = (self.step + n - 1) // self.step * self.step

        def grown(kv: Tensor, new: mx.array) -> Tensor:
            shape = (new.shape[0], new.shape[1], steps, new.shape[3])
            blank = quantize(mx.zeros(shape, new.dtype), self.quant)  # type: ignore[arg-type]
            if kv is None:
                return blank
            return tuple(
                mx.concatenate([x[..., :prev, :], b], axis=2)
                for x, b in zip(kv, blank, strict=True)
            )

        self.keys = grown(self.keys, keys)
        self.values = grown(self.values, values)


def _as_batch(other: Any, quant: KVQuantization | None) -> BatchKVCache:
    """mlx-lm's own batch cache (a model whose rows were made elsewhere) as this one."""
    if isinstance(other, BatchKVCache):
        return other
    batch = BatchKVCache([0] * int(other.left_padding.shape[0]), None, quant)
    batch.keys, batch.values = other.keys, other.values
    batch.offset, batch.left_padding, batch._idx = other.offset, other.left_padding, other._idx
    return batch
