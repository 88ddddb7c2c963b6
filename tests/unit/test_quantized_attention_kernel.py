"""The extension's decode attention over a quantized KV cache (`kv_cache.bits`) against
mlx_lm's quantized attention, and the swap routing a quantized cache's steps to it."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models import base
from mlx_lm.models.cache import QuantizedKVCache

from vllm_mlx.models.cpu import attention, qmm

BUILT = attention.available() and hasattr(qmm.extension(), "sdpa_decode_quantized")
pytestmark = pytest.mark.skipif(not BUILT, reason=f"kernel unavailable: {qmm.status().detail}")
TOL = 3e-5  # MLX's quantized matmuls sum in another order: rounding, never more
Triple = tuple[mx.array, mx.array, mx.array]


def cached(
    b: int, hkv: int, t: int, d: int, bits: int, group: int, seed: int = 0
) -> tuple[QuantizedKVCache, Triple, Triple]:
    """K and V of t positions through mlx_lm's QuantizedKVCache: slices of its buffers."""
    cache = QuantizedKVCache(group_size=group, bits=bits)
    k = mx.random.normal((b, hkv, t, d), key=mx.random.key(seed + 1))
    v = mx.random.normal((b, hkv, t, d), key=mx.random.key(seed + 2))
    keys, values = cache.update_and_fetch(k, v)
    return cache, tuple(keys), tuple(values)  # type: ignore[return-value]


def reference(
    q: mx.array, keys: Triple, values: Triple, mask: mx.array | str | None, bits: int, group: int
) -> mx.array:
    # mlx_lm scales its queries in place (`queries *= scale`): hand it a copy of q.
    return base.quantized_scaled_dot_product_attention(
        mx.array(q),
        keys,
        values,
        0.125,
        mask,  # type: ignore[arg-type]
        group_size=group,
        bits=bits,
    )


def close(got: mx.array, want: mx.array) -> None:
    assert got.shape == want.shape and got.dtype == mx.float32
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=TOL, atol=TOL)


def same_bits(got: mx.array, want: mx.array) -> bool:
    return bool((np.array(got).view(np.uint32) == np.array(want).view(np.uint32)).all())


SHAPES = [  # (B, Hq, Hkv, D, T): GQA 9/3 as the bundled model, MHA, MQA; T past blocks of 64
    (1, 9, 3, 64, 1),
    (2, 9, 3, 64, 300),
    (3, 4, 4, 128, 77),
    (1, 8, 1, 64, 1000),
]


# Every group size that divides the shape's head dimension (MLX quantizes whole groups).
CASES = [(shape, group) for shape in SHAPES for group in (32, 64, 128) if shape[3] % group == 0]


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize(
    ("shape", "group"), CASES, ids=[f"{'x'.join(map(str, s))}-g{g}" for s, g in CASES]
)
def test_matches_mlx_lm_for_every_width_group_shape_and_mask(
    isa: str, bits: int, group: int, shape: tuple[int, ...]
) -> None:
    b, hq, hkv, d, t = shape
    _, keys, values = cached(b, hkv, t, d, bits, group, seed=t)
    q = mx.random.normal((b, hq, 1, d), key=mx.random.key(t))
    keep = mx.random.uniform(shape=(b, 1, 1, t), key=mx.random.key(t + 3)) > 0.3
    ext = qmm.extension()
    for mask in (None, keep, mx.where(keep, 0.0, -1e9)):
        got = ext.sdpa_decode_quantized(q, keys, values, 0.125, group, bits, mask)
        close(got, reference(q, keys, values, mask, bits, group))


@pytest.mark.parametrize("bits", [4, 8])
def test_several_positions_causal_and_with_a_batch_mask(isa: str, bits: int) -> None:
    """A short chunk at offset t - m: causal, and a left-padded batch cache's mask."""
    m, t = 4, 150
    _, keys, values = cached(2, 3, t, 64, bits, 64, seed=bits)
    q = mx.random.normal((2, 9, m, 64), key=mx.random.key(9))
    ext = qmm.extension()
    got = ext.sdpa_decode_quantized(q, keys, values, 0.125, 64, bits, causal=True)
    close(got, reference(q, keys, values, "causal", bits, 64))
    mask = base.create_causal_mask(m, offset=t - m, left_padding=mx.array([0, 7]))
    got = ext.sdpa_decode_quantized(q, keys, values, 0.125, 64, bits, mask)
    close(got, reference(q, keys, values, mask, bits, 64))


def test_threads_and_batch_give_each_row_the_same_bits(isa: str, threaded: None) -> None:
    """A sequence alone (one thread) and inside a batch split over threads: bit for bit."""
    ext = qmm.extension()
    _, keys, values = cached(4, 3, 200, 64, 8, 32)
    q = mx.random.normal((4, 9, 1, 64), key=mx.random.key(4))
    batch = ext.sdpa_decode_quantized(q, keys, values, 0.125, 32, 8)
    ext.set_threads(1)
    for i in range(4):
        one = tuple(x[i : i + 1] for x in keys), tuple(x[i : i + 1] for x in values)
        alone = ext.sdpa_decode_quantized(q[i : i + 1], *one, 0.125, 32, 8)
        assert same_bits(alone, batch[i : i + 1]), i


def test_triples_not_contiguous_in_the_last_dimension_are_read_right() -> None:
    _, keys, values = cached(2, 3, 40, 64, 8, 32)
    q = mx.random.normal((2, 9, 1, 64), key=mx.random.key(1))

    def strided(x: mx.array) -> mx.array:  # same contents, last-dimension stride != 1
        return mx.swapaxes(mx.swapaxes(x, 2, 3) + mx.zeros((), dtype=x.dtype), 2, 3)

    odd_k = tuple(strided(x) for x in keys)
    odd_v = tuple(strided(x) for x in values)
    got = qmm.extension().sdpa_decode_quantized(q, odd_k, odd_v, 0.125, 32, 8)
    close(got, reference(q, keys, values, None, 8, 32))


def test_bad_inputs_raise_value_errors() -> None:
    ext = qmm.extension()
    _, keys, values = cached(2, 3, 10, 64, 8, 32)
    q = mx.random.normal((2, 9, 1, 64))
    half = (keys[0], keys[1].astype(mx.float16), keys[2].astype(mx.float16))
    bad = [
        ((q, keys, values, 0.125, 32, 3), "bits must be 4 or 8"),
        ((q, keys, values, 0.125, 16, 8), "group_size"),
        ((q.astype(mx.float16), keys, values, 0.125, 32, 8), "float32"),
        ((mx.concatenate([q] * 65, axis=2), keys, values, 0.125, 32, 8), "positions"),
        ((q, half, values, 0.125, 32, 8), "words, float32 scales"),
        ((q, keys[:2], values, 0.125, 32, 8), "words, float32 scales"),
        ((q[:1], keys, values, 0.125, 32, 8), "batch size"),
        ((q[:, :8], keys, values, 0.125, 32, 8), "divides"),
        ((q, keys, tuple(x[..., :5, :] for x in values), 0.125, 32, 8), "length"),
        ((q, keys, values, 0.125, 32, 4), "head dim"),  # 8-bit words read as 4-bit
        ((q[..., :32], keys, values, 0.125, 32, 8), "head dim"),
    ]
    for args, message in bad:
        with pytest.raises(ValueError, match=message):
            ext.sdpa_decode_quantized(*args)
    with pytest.raises(ValueError, match="broadcast"):
        ext.sdpa_decode_quantized(q, keys, values, 0.125, 32, 8, mx.ones((2, 1, 1, 11), mx.bool_))
    with pytest.raises(ValueError, match="exclude each other"):
        ext.sdpa_decode_quantized(
            q, keys, values, 0.125, 32, 8, mx.ones((2, 1, 1, 10), mx.bool_), causal=True
        )


@pytest.mark.parametrize(
    ("m", "t", "bits", "group"), [(4, 2100, 8, 32), (8, 700, 4, 64), (100, 1000, 4, 32)]
)
def test_prefill_over_the_packed_rows_gives_the_unpacked_caches_bits(
    isa: str, threaded: None, m: int, t: int, bits: int, group: int
) -> None:
    """`sdpa_prefill_quantized` dequantizes each key block as MLX does, so its bits are
    `sdpa_prefill`'s over the unpacked cache: short chunks (packed lanes, split keys) and
    long ones, causal, a left-padded batch mask, none."""
    ext = qmm.extension()
    _, keys, values = cached(2, 3, t, 64, bits, group, seed=t)
    q = mx.random.normal((2, 9, m, 64), key=mx.random.key(m))
    floats = (unpack(keys, bits, group), unpack(values, bits, group))
    padded = base.create_causal_mask(m, offset=t - m, left_padding=mx.array([0, t // 3]))
    for causal, mask in (
        (True, None),
        (False, mx.broadcast_to(padded, (2, 1, m, t))),
        (False, None),
    ):
        got = ext.sdpa_prefill_quantized(q, keys, values, 0.125, group, bits, causal, mask)
        assert same_bits(got, ext.sdpa_prefill(q, *floats, 0.125, causal, mask))


def test_bad_prefill_inputs_raise_value_errors() -> None:
    ext = qmm.extension()
    _, keys, values = cached(2, 3, 10, 64, 8, 32)
    q = mx.random.normal((2, 9, 4, 64))
    half = (keys[0], keys[1].astype(mx.float16), keys[2].astype(mx.float16))
    bad = [
        ((q, keys, values, 0.125, 32, 3, True), "bits must be 4 or 8"),
        ((q, keys, values, 0.125, 16, 8, True), "group_size"),
        ((q.astype(mx.float16), keys, values, 0.125, 32, 8, True), "float32"),
        ((q[:, :, :0], keys, values, 0.125, 32, 8, True), "at least one position"),
        ((q, half, values, 0.125, 32, 8, True), "words, float32 scales"),
        ((q, keys[:2], values, 0.125, 32, 8, True), "words, float32 scales"),
        ((q[:1], keys, values, 0.125, 32, 8, True), "batch size"),
        ((q[:, :8], keys, values, 0.125, 32, 8, True), "divides"),
        ((q, keys, tuple(x[..., :5, :] for x in values), 0.125, 32, 8, True), "length"),
        ((q, keys, values, 0.125, 32, 4, True), "head dim"),  # 8-bit words read as 4-bit
        ((q, keys, values, 0.125, 32, 8, False, mx.ones((2, 1, 4, 11), mx.bool_)), "mask"),
        ((q, keys, values, 0.125, 32, 8, False, mx.ones((2, 9, 4, 10), mx.bool_)), "mask"),
        ((q, keys, values, 0.125, 32, 8, False, mx.zeros((2, 1, 4, 10))), "mask"),
    ]
    for args, message in bad:
        with pytest.raises(ValueError, match=message):
            ext.sdpa_prefill_quantized(*args)


def test_a_quantized_caches_steps_go_to_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the swapped function: decode steps and short chunks over a quantized cache
    take the decode kernel; a longer chunk does not."""
    ext = qmm.extension()
    calls: list[int] = []
    original = ext.sdpa_decode_quantized

    def counted(q: mx.array, *args: object, **kw: object) -> mx.array:
        calls.append(q.shape[2])
        return original(q, *args, **kw)  # type: ignore[no-any-return]

    monkeypatch.setattr(ext, "sdpa_decode_quantized", counted)
    cache, keys, values = cached(1, 3, 90, 64, 4, 64)
    n = attention.DECODE_KERNEL_CHUNK_QUERIES
    for m, mask in ((1, None), (3, "causal"), (n + 1, "causal")):
        q = mx.random.normal((1, 9, m, 64), key=mx.random.key(m))
        want = reference(q, keys, values, mask, 4, 64)
        got = attention.scaled_dot_product_attention(mx.array(q), keys, values, cache, 0.125, mask)
        close(got, want)
    assert calls == [1, 3]


@pytest.mark.parametrize("pad", [3, 70])
def test_left_padding_leaves_a_rows_bits_as_alone(isa: str, pad: int) -> None:
    """What makes a quantized row decode alike alone and in a batch (kv_cache.bits'
    promise): positions its bool mask excludes before its first key change no bit."""
    k = mx.random.normal((1, 3, 120, 64), key=mx.random.key(1))
    v = mx.random.normal((1, 3, 120, 64), key=mx.random.key(2))
    junk = mx.random.normal((1, 3, pad, 64), key=mx.random.key(3))
    q = mx.random.normal((1, 9, 1, 64), key=mx.random.key(4))
    keep = mx.concatenate([mx.zeros((pad,), mx.bool_), mx.ones((120,), mx.bool_)])
    ext = qmm.extension()
    outs = []
    for keys, values, mask in ((k, v, None), (mx.concatenate([junk, k], axis=2),
                                              mx.concatenate([junk, v], axis=2),
                                              keep.reshape(1, 1, 1, -1))):  # fmt: skip
        cache = QuantizedKVCache(group_size=64, bits=8)
        kq, vq = cache.update_and_fetch(keys, values)
        outs.append(ext.sdpa_decode_quantized(q, tuple(kq), tuple(vq), 0.125, 64, 8, mask))
    assert same_bits(outs[1], outs[0])


def unpack(triple: Triple, bits: int, group: int) -> mx.array:
    """A quantized K or V as the float kernels would read it unpacked (MLX's floats)."""
    words, scales, biases = triple
    rows = words.shape[0] * words.shape[1] * words.shape[2]
    flat = qmm.extension().dequantize(
        words.reshape(rows, -1), scales.reshape(rows, -1), biases.reshape(rows, -1), group, bits
    )
    return flat.reshape(*words.shape[:3], -1)


def test_a_prefill_chunk_reads_the_quantized_cache_in_place(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A chunk of more than DECODE_KERNEL_CHUNK_QUERIES over a quantized cache: the fused
    kernel dequantizes a block of keys at a time (the cache is never unpacked whole), with
    the bits of the float kernel over the unpacked cache and close to mlx_lm's quantized
    path, causal and with a left-padded batch mask. Without register tiles (the scalar
    instruction set) the cache is unpacked on every core for the BLAS products. An additive
    mask stays on mlx_lm's path."""
    ext = qmm.extension()
    unpacked: list[tuple[int, ...]] = []
    original = ext.dequantize

    def counted(w: mx.array, *args: object, **kw: object) -> mx.array:
        unpacked.append(tuple(w.shape))
        return original(w, *args, **kw)  # type: ignore[no-any-return]

    t = 300
    for bits, m in ((8, 40), (4, 7), (8, 100)):
        cache, keys, values = cached(2, 3, t, 64, bits, 32, seed=m)
        q = mx.random.normal((2, 9, m, 64), key=mx.random.key(m))
        keep = base.create_causal_mask(m, offset=t - m, left_padding=mx.array([0, 11]))
        for mask in ("causal", keep):
            want = reference(q, keys, values, mask, bits, 32)
            floats = (unpack(keys, bits, 32), unpack(values, bits, 32))
            fused = ext.sdpa_prefill(
                q,
                *floats,
                0.125,
                isinstance(mask, str),
                None if isinstance(mask, str) else mx.broadcast_to(mask, (2, 1, m, t)),
            )
            monkeypatch.setattr(ext, "dequantize", counted)
            got = attention.scaled_dot_product_attention(
                mx.array(q), keys, values, cache, 0.125, mask
            )
            monkeypatch.setattr(ext, "dequantize", original)
            close(got, want)
            assert same_bits(got, fused)
    assert unpacked == []
    ext.set_isa("scalar")
    monkeypatch.setattr(ext, "dequantize", counted)
    try:
        cache, keys, values = cached(2, 3, t, 64, 8, 32, seed=1)
        q = mx.random.normal((2, 9, 7, 64), key=mx.random.key(1))
        got = attention.scaled_dot_product_attention(
            mx.array(q), keys, values, cache, 0.125, "causal"
        )
        close(got, reference(q, keys, values, "causal", 8, 32))
    finally:
        ext.set_isa("best")
    assert unpacked == [(2 * 3 * t, 16)] * 2  # K and V
    cache, keys, values = cached(1, 3, 50, 64, 8, 32)
    q = mx.random.normal((1, 9, 6, 64))
    additive = mx.zeros((1, 1, 6, 50))
    want = reference(q, keys, values, additive, 8, 32)
    got = attention.scaled_dot_product_attention(mx.array(q), keys, values, cache, 0.125, additive)
    assert same_bits(got, want)


def test_left_padding_is_never_read(isa: str) -> None:
    """Positions before every row's first kept key are not unpacked: NaN scales there
    (which any read would spread) change no bit."""
    k = mx.random.normal((2, 3, 200, 64), key=mx.random.key(1))
    v = mx.random.normal((2, 3, 200, 64), key=mx.random.key(2))
    q = mx.random.normal((2, 9, 1, 64), key=mx.random.key(4))
    starts = mx.array([0, 130]).reshape(2, 1, 1, 1)
    keep = mx.arange(200).reshape(1, 1, 1, -1) >= starts
    cache = QuantizedKVCache(group_size=64, bits=4)
    kq, vq = (tuple(x) for x in cache.update_and_fetch(k, v))
    blank = mx.arange(200).reshape(1, 1, -1, 1) < starts

    def poisoned(triple: tuple[mx.array, ...]) -> tuple[mx.array, ...]:
        words, scales, biases = triple
        return words, mx.where(blank, mx.nan, scales), mx.where(blank, mx.nan, biases)

    ext = qmm.extension()
    clean = ext.sdpa_decode_quantized(q, kq, vq, 0.125, 64, 4, keep)
    got = ext.sdpa_decode_quantized(q, poisoned(kq), poisoned(vq), 0.125, 64, 4, keep)
    assert not np.isnan(np.array(got)).any()
    assert same_bits(got, clean)
