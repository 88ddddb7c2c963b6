"""engine/cache/rows.py's batch cache against mlx-lm's, on random K and V."""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache as MlxBatchKVCache
from mlx_lm.models.cache import KVCache

from vllm_mlx.engine.cache.rows import (
    BatchKVCache,
    KVQuantization,
    QuantizedRowKVCache,
    RowKVCache,
    cache_tags,
    row_caches,
)

HEADS, DIM = 2, 64
Q8 = KVQuantization(8, 32)


def _plain(length: int, seed: int) -> KVCache:
    mx.random.seed(seed)
    cache = KVCache()  # type: ignore[no-untyped-call]
    k = mx.random.normal((1, HEADS, length, DIM))
    v = mx.random.normal((1, HEADS, length, DIM))
    cache.update_and_fetch(k, v)  # type: ignore[no-untyped-call]
    return cache


def _dequantized(kv: tuple[mx.array, ...], quant: KVQuantization) -> mx.array:
    return mx.dequantize(*kv, group_size=quant.group_size, bits=quant.bits)


def test_full_precision_rows_merge_exactly_as_mlx_lm_merges_them() -> None:
    plain = [_plain(5, 1), _plain(9, 2), _plain(1, 3)]
    ours = BatchKVCache.from_rows(row_caches(plain, "t", None), None)
    theirs = MlxBatchKVCache.merge(plain)
    assert mx.array_equal(ours.keys, theirs.keys) and mx.array_equal(ours.values, theirs.values)
    assert ours.left_padding.tolist() == theirs.left_padding.tolist()
    assert ours.offset.tolist() == theirs.offset.tolist() and ours._idx == theirs._idx
    assert not hasattr(ours, "bits")  # mlx_lm's float attention path


def test_quantized_rows_keep_their_values_to_the_quantization_error() -> None:
    plain = [_plain(5, 1), _plain(9, 2)]
    batch = BatchKVCache.from_rows(row_caches(plain, None, Q8), Q8)
    assert batch.bits == 8 and batch.group_size == 32
    keys = _dequantized(batch.keys, Q8)
    assert batch.left_padding.tolist() == [4, 0]
    assert mx.allclose(keys[0:1, :, 4:9], plain[0].keys[..., :5, :], atol=0.05)
    assert mx.allclose(keys[1:2, :, 0:9], plain[1].keys[..., :9, :], atol=0.05)


def test_decoding_writes_quantized_positions_after_the_rows() -> None:
    batch = BatchKVCache.from_rows(row_caches([_plain(3, 1), _plain(6, 2)], None, Q8), Q8)
    new_k, new_v = mx.random.normal((2, HEADS, 1, DIM)), mx.random.normal((2, HEADS, 1, DIM))
    keys, _ = batch.update_and_fetch(new_k, new_v)
    assert isinstance(keys, tuple) and keys[0].shape[2] == 7
    assert mx.allclose(_dequantized(keys, Q8)[..., 6:7, :], new_k, atol=0.05)
    assert batch.offset.tolist() == [4, 7]


def test_a_batch_turns_quantized_when_its_longest_row_reaches_the_threshold() -> None:
    late = KVQuantization(8, 32, quantized_after=8)
    batch = BatchKVCache.from_rows(row_caches([_plain(6, 1)], None, late), late)
    assert not hasattr(batch, "bits")
    batch.update_and_fetch(mx.zeros((1, HEADS, 1, DIM)), mx.zeros((1, HEADS, 1, DIM)))
    assert not hasattr(batch, "bits")  # 7 tokens
    keys, _ = batch.update_and_fetch(mx.zeros((1, HEADS, 1, DIM)), mx.zeros((1, HEADS, 1, DIM)))
    assert batch.bits == 8 and isinstance(keys, tuple) and keys[0].shape[2] == 8


def test_extending_mixes_forms_and_keeps_tags_aligned_through_filter_and_extract() -> None:
    late = KVQuantization(8, 32, quantized_after=8)
    full = BatchKVCache.from_rows(row_caches([_plain(3, 1)], "base", late), late)
    quantized = BatchKVCache.from_rows(row_caches([_plain(12, 2)], "lora-a", late), late)
    assert not hasattr(full, "bits") and quantized.bits == 8
    full.extend(quantized)
    assert full.bits == 8 and full.tags == ["base", "lora-a"]
    assert full.left_padding.tolist() == [9, 0]
    keys = _dequantized(full.keys, late)
    assert mx.allclose(keys[0:1, :, 9:12], _plain(3, 1).keys[..., :3, :], atol=0.05)
    assert cache_tags([object(), full]) == ["base", "lora-a"]
    row = full.extract(0)
    assert isinstance(row, QuantizedRowKVCache) and row.tag == "base" and row.offset == 3
    full.filter([1])
    assert full.tags == ["lora-a"] and full.left_padding.tolist() == [0]


def test_a_stored_row_goes_back_into_a_batch() -> None:
    batch = BatchKVCache.from_rows(row_caches([_plain(4, 1), _plain(2, 2)], "x", Q8), Q8)
    rows = [batch.extract(0), batch.extract(1)]
    again = rows[0].merge(rows)
    assert again.bits == 8 and again.tags == ["x", "x"]
    assert mx.array_equal(again.keys[0], batch.keys[0][..., : again._idx, :])
    plain_row = BatchKVCache.from_rows(row_caches([_plain(4, 1)], None, None), None).extract(0)
    assert type(plain_row) is RowKVCache and plain_row.offset == 4


def test_extending_lines_rows_up_as_mlx_lm_and_leaves_room_for_the_next_step() -> None:
    """A long row joining short ones: the same K, V, padding and offsets as mlx-lm's extend
    over the used positions, zeros in the padding, and a buffer the next decode step writes
    into in place (mlx-lm's is exactly as long as the long row: its first step copies
    the whole batch cache to grow it)."""
    short, long = [_plain(5, 1), _plain(9, 2)], [_plain(300, 3)]
    ours = BatchKVCache.from_rows(row_caches(short, "a", None), None)
    ours.extend(BatchKVCache.from_rows(row_caches(long, "b", None), None))
    theirs = MlxBatchKVCache.merge(short)
    theirs.extend(MlxBatchKVCache.merge(long))
    used = theirs._idx
    assert ours._idx == used == 300 and ours.tags == ["a", "a", "b"]
    for mine, want in ((ours.keys, theirs.keys), (ours.values, theirs.values)):
        assert mx.array_equal(mine[..., :used, :], want[..., :used, :])
        assert not mx.any(mine[:2, :, : 300 - 9, :]).item()  # padding is zeros
    assert ours.left_padding.tolist() == theirs.left_padding.tolist() == [295, 291, 0]
    assert ours.offset.tolist() == theirs.offset.tolist() == [5, 9, 300]
    assert ours.decode_slot() == 300 and ours.keys.shape[2] == 512
    assert theirs.keys.shape[2] == 300  # no room: the next step grows it by a copy
    # a batch without K or V yet joins as rows of zeros
    empty = BatchKVCache.from_rows(row_caches([KVCache()], None, None), None)  # type: ignore[no-untyped-call]
    empty.extend(BatchKVCache.from_rows(row_caches(short, None, None), None))
    assert empty.keys.shape[0] == 3 and not mx.any(empty.keys[0]).item()
    assert mx.array_equal(empty.keys[1:, :, :9, :], MlxBatchKVCache.merge(short).keys)


def test_a_prompt_read_in_chunks_grows_its_buffer_once() -> None:
    """With the prompt's length reserved, the first chunk that needs room grows the
    buffers to the prompt's end and every later chunk writes in place; the K and V are
    mlx-lm's. Without it, mlx-lm's steps of 256."""
    k = mx.random.normal((1, HEADS, 1000, DIM), key=mx.random.key(8))
    v = mx.random.normal((1, HEADS, 1000, DIM), key=mx.random.key(9))
    reserved = BatchKVCache.from_rows(row_caches([KVCache()], None, None, 1000), None)  # type: ignore[no-untyped-call]
    plain = BatchKVCache.from_rows(row_caches([KVCache()], None, None), None)  # type: ignore[no-untyped-call]
    theirs = MlxBatchKVCache([0])
    sizes, plain_sizes = set(), []
    for start in range(0, 1000, 100):
        chunk = (k[..., start : start + 100, :], v[..., start : start + 100, :])
        got, _ = reserved.update_and_fetch(*chunk)
        plain.update_and_fetch(*chunk)
        want, _ = theirs.update_and_fetch(*chunk)
        assert mx.array_equal(got, want)
        sizes.add(reserved.keys.shape[2])
        plain_sizes.append(plain.keys.shape[2])
    assert sizes == {1024}
    assert plain_sizes[:3] == [256, 256, 456]  # mlx-lm's steps: a copy at each
    # a cached prefix: the reserve counts from where each row sits in the batch
    rows = [
        *row_caches([_plain(5, 1)], None, None, 300),
        *row_caches([_plain(9, 2)], None, None, 20),
    ]
    batch = BatchKVCache.from_rows(rows, None)
    assert batch.reserve == 4 + 300
    batch.update_and_fetch(mx.zeros((2, HEADS, 50, DIM)), mx.zeros((2, HEADS, 50, DIM)))
    assert batch.keys.shape[2] == 512 and batch._idx == 59
    assert mx.array_equal(batch.keys[0:1, :, 4:9, :], _plain(5, 1).keys[..., :5, :])
