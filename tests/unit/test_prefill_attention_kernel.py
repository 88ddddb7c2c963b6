"""The extension's fused prefill attention (`sdpa_prefill`, kernels/attn_prefill.cpp)
against mlx_lm's own `scaled_dot_product_attention` (MLX's CPU fallback), and its routing
in models/cpu/attention.py."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mlx_lm.models import base
from mlx_lm.models.cache import BatchKVCache

from vllm_mlx.models.cpu import attention, qmm

pytestmark = pytest.mark.skipif(
    not (attention.available() and hasattr(qmm.extension(), "sdpa_prefill")),
    reason=f"kernel unavailable: {qmm.status().detail}",
)
TOL = 2e-5  # an online softmax and sums in another order than BLAS's: rounding, never more
Mask = mx.array | str | None


def qkv(
    b: int, hq: int, hkv: int, m: int, t: int, d: int = 64, dv: int | None = None, seed: int = 0
) -> tuple[mx.array, mx.array, mx.array]:
    """q laid out as the model's (B, M, H, D) transposed; k and v as slices of a longer
    cache buffer, as mlx_lm's KVCache returns them."""
    dv = d if dv is None else dv
    q = mx.random.normal((b, m, hq, d), key=mx.random.key(seed)).transpose(0, 2, 1, 3)
    k = mx.random.normal((b, hkv, t + 29, d), key=mx.random.key(seed + 1))
    v = mx.random.normal((b, hkv, t + 29, dv), key=mx.random.key(seed + 2))
    return q, k[..., :t, :], v[..., :t, :]


def reference(q: mx.array, k: mx.array, v: mx.array, scale: float, mask: Mask) -> mx.array:
    return base.scaled_dot_product_attention(q, k, v, None, scale, mask)  # type: ignore[arg-type]


def fused(q: mx.array, k: mx.array, v: mx.array, scale: float, mask: Mask) -> mx.array:
    ext = qmm.extension()
    if isinstance(mask, mx.array):
        return ext.sdpa_prefill(q, k, v, scale, False, mask)  # type: ignore[no-any-return]
    return ext.sdpa_prefill(q, k, v, scale, mask is not None)  # type: ignore[no-any-return]


def close(got: mx.array, want: mx.array) -> None:
    assert got.shape == want.shape and got.dtype == mx.float32
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=TOL, atol=TOL)


def same_bits(got: mx.array, want: mx.array) -> bool:
    return bool((np.array(got).view(np.uint32) == np.array(want).view(np.uint32)).all())


def padded_mask(m: int, t: int, pads: list[int]) -> mx.array:
    """The bool mask mlx_lm's BatchKVCache makes for a chunk of m queries at offset t - m."""
    mask = base.create_causal_mask(m, offset=t - m, left_padding=mx.array(pads))
    return mx.broadcast_to(mask, (len(pads), 1, m, t))


SHAPES = [  # (B, Hq, Hkv, M queries, L keys): GQA 3 (the bundled model's 9/3) and 1
    (1, 9, 3, 1, 1),  # one row
    (1, 9, 3, 1, 9),
    (1, 9, 3, 7, 7),  # fewer queries than a block, offset 0
    (1, 9, 3, 64, 64),  # exactly one block
    (1, 9, 3, 100, 100),  # a partial second block, offset 0
    (1, 9, 3, 65, 300),  # one query past a block, offset 235
    (2, 4, 4, 33, 65),  # MHA, batch 2, key count past a block
    (1, 3, 1, 130, 1030),
    (3, 6, 2, 129, 129),
    # Short chunks (fewer queries than the 64 lanes): query heads packed into the lanes,
    # keys past 512 split into ranges of 256 folded at the end.
    (1, 9, 3, 4, 2100),  # a paced chunk after 2k: 3 heads x 4 rows in 16 lanes, 8 ranges
    (2, 9, 3, 8, 3100),  # batch 2, 12 ranges; the padded row skips whole ranges
    (1, 9, 3, 21, 1100),  # 63 lanes
    (1, 9, 3, 32, 2048),  # 2 heads packed, then 1
    (1, 8, 1, 5, 1030),  # 8 heads x 5 rows: 40 lanes
    (1, 12, 2, 40, 70),  # 40 rows a head: one head a group, 48 lanes
]


@pytest.mark.parametrize(("b", "hq", "hkv", "m", "t"), SHAPES, ids=lambda s: str(s))
def test_matches_mlx_causal_masked_and_unmasked(
    isa: str, threaded: None, b: int, hq: int, hkv: int, m: int, t: int
) -> None:
    q, k, v = qkv(b, hq, hkv, m, t, seed=m + t)
    pads = [0, min(5, t) if t < 3000 else 2500, t // 2][:b]
    for mask in ("causal", None, padded_mask(m, t, pads)):
        close(fused(q, k, v, 0.125, mask), reference(q, k, v, 0.125, mask))


@pytest.mark.parametrize(("d", "dv"), [(40, 40), (72, 72), (128, 128), (64, 40), (96, 13)])
def test_other_head_dims(isa: str, d: int, dv: int) -> None:
    q, k, v = qkv(2, 6, 2, 70, 90, d, dv, seed=d)
    for mask in ("causal", padded_mask(70, 90, [0, 3])):
        close(fused(q, k, v, d**-0.5, mask), reference(q, k, v, d**-0.5, mask))


def test_a_long_chunk_at_the_end_of_a_long_cache(threaded: None) -> None:
    """The bundled model's prefill shape: a 512-query chunk against 2,048 keys."""
    q, k, v = qkv(1, 9, 3, 512, 2048, seed=3)
    close(fused(q, k, v, 0.125, "causal"), reference(q, k, v, 0.125, "causal"))


def test_one_mask_for_every_sequence_and_arbitrary_masks(isa: str) -> None:
    q, k, v = qkv(3, 4, 2, 40, 75, seed=4)
    shared = mx.random.uniform(shape=(1, 1, 40, 75), key=mx.random.key(9)) > 0.4
    per_row = mx.random.uniform(shape=(3, 1, 40, 75), key=mx.random.key(10)) > 0.9
    for mask in (shared, per_row):
        close(fused(q, k, v, 0.125, mask), reference(q, k, v, 0.125, mask))


def test_queries_that_see_no_key_average_v_like_mlx(isa: str, threaded: None) -> None:
    """Left padding longer than the chunk: MLX masks with finfo.min, not -inf, so a row
    with nothing to attend gets a uniform softmax over every key, the mean of V."""
    q, k, v = qkv(3, 9, 3, 70, 70, seed=5)
    mask = padded_mask(70, 70, [0, 67, 69])
    got = fused(q, k, v, 0.125, mask)
    assert bool(mx.all(mx.isfinite(got)).item())
    close(got, reference(q, k, v, 0.125, mask))
    mean = mx.repeat(v[1].mean(axis=1, keepdims=True), 3, axis=0)  # 3 query heads per KV head
    close(got[1, :, :67], mx.broadcast_to(mean, (9, 67, 64)))
    # Causally, when there are fewer keys than queries, as MLX's causal mask does.
    q, k, v = qkv(1, 4, 2, 9, 5, seed=6)
    close(fused(q, k, v, 0.125, "causal"), reference(q, k, v, 0.125, "causal"))


def test_a_batch_cache_prefill_of_left_padded_prompts(isa: str) -> None:
    """The mask mlx_lm's BatchKVCache makes for a prefill chunk, and K/V from the cache."""
    cache = BatchKVCache([0, 30, 77])
    k = mx.random.normal((3, 3, 100, 64), key=mx.random.key(11))
    v = mx.random.normal((3, 3, 100, 64), key=mx.random.key(12))
    cache.update_and_fetch(k[:, :, :60], v[:, :, :60])
    mask = cache.make_mask(40)
    keys, values = cache.update_and_fetch(k[:, :, 60:], v[:, :, 60:])
    assert isinstance(mask, mx.array) and mask.shape == (3, 1, 40, 100)
    q = mx.random.normal((3, 9, 40, 64), key=mx.random.key(13))
    close(fused(q, keys, values, 0.125, mask), reference(q, keys, values, 0.125, mask))


def test_large_and_tiny_scales(isa: str) -> None:
    q, k, v = qkv(1, 4, 2, 50, 80, seed=7)
    for scale in (8.0, 1e-6):
        close(fused(q, k, v, scale, "causal"), reference(q, k, v, scale, "causal"))


def test_threads_and_batch_give_each_sequence_the_same_bits(isa: str, threaded: None) -> None:
    """A sequence alone (one thread) and inside a batch split over threads: bit for bit."""
    ext = qmm.extension()
    q, k, v = qkv(3, 9, 3, 100, 180, seed=8)
    mask = padded_mask(100, 180, [0, 7, 130])
    batch = fused(q, k, v, 0.125, mask)
    causal = fused(q, k, v, 0.125, "causal")
    # One sequence of two query blocks is 6 units of 3 query heads: too few for 2 threads,
    # so there each query head is a unit of its own.
    split = fused(q[:1], k[:1], v[:1], 0.125, "causal")
    ext.set_threads(1)
    for i in range(3):
        one = (q[i : i + 1], k[i : i + 1], v[i : i + 1])
        assert same_bits(fused(*one, 0.125, mask[i : i + 1]), batch[i : i + 1]), i
        assert same_bits(fused(*one, 0.125, "causal"), causal[i : i + 1]), i
    assert same_bits(split, causal[:1])


@pytest.mark.parametrize(("m", "t"), [(4, 2100), (8, 4200), (21, 1100), (32, 2200), (13, 700)])
def test_a_short_chunks_rows_get_the_bits_they_get_alone(
    isa: str, threaded: None, m: int, t: int
) -> None:
    """Packed lanes and split keys change no row's bits: each query head alone (no
    neighbours in its lanes), each sequence alone in a batch, and one thread against two
    give the same bits (the key ranges depend on the key count alone)."""
    ext = qmm.extension()
    q, k, v = qkv(2, 9, 3, m, t, seed=m)
    mask = padded_mask(m, t, [0, t // 3])
    batch = fused(q, k, v, 0.125, mask)
    causal = fused(q, k, v, 0.125, "causal")
    close(causal, reference(q, k, v, 0.125, "causal"))
    for h in (0, 4, 8):
        alone = fused(
            q[:, h : h + 1], k[:, h // 3 : h // 3 + 1], v[:, h // 3 : h // 3 + 1], 0.125, "causal"
        )
        assert same_bits(alone, causal[:, h : h + 1]), h
    ext.set_threads(1)
    for i in range(2):
        one = (q[i : i + 1], k[i : i + 1], v[i : i + 1])
        assert same_bits(fused(*one, 0.125, mask[i : i + 1]), batch[i : i + 1]), i
        assert same_bits(fused(*one, 0.125, "causal"), causal[i : i + 1]), i


@st.composite
def short_chunks(draw: st.DrawFn) -> dict[str, object]:
    """A chunk of 1-40 queries (packed lanes up to 32, key ranges past 512 keys), grouped
    heads, and a batch cache's left padding (a row may see no key at all)."""
    m = draw(st.integers(1, 40))
    t = draw(st.integers(m, 1300))
    b = draw(st.integers(1, 2))
    return {
        "b": b, "hkv": draw(st.integers(1, 3)), "groups": draw(st.integers(1, 9)), "m": m,
        "t": t, "d": draw(st.sampled_from([16, 64, 72])),
        "pads": [draw(st.integers(0, t)) for _ in range(b)],
        "mask": draw(st.sampled_from(["causal", "padded", "none"])),
        "seed": draw(st.integers(0, 2**16)),
    }  # fmt: skip


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(problem=short_chunks())
def test_short_chunks_match_mlx(isa: str, threaded: None, problem: dict[str, object]) -> None:
    b, hkv, groups, m, t, d = (int(problem[k]) for k in ("b", "hkv", "groups", "m", "t", "d"))  # type: ignore[call-overload]
    q, k, v = qkv(b, hkv * groups, hkv, m, t, d, seed=int(problem["seed"]))  # type: ignore[call-overload]
    mask: Mask = {"causal": "causal", "none": None}.get(str(problem["mask"]))
    if problem["mask"] == "padded":
        mask = padded_mask(m, t, list(problem["pads"]))  # type: ignore[call-overload]
    got = fused(q, k, v, d**-0.5, mask)
    assert bool(mx.isfinite(got).all().item())
    close(got, reference(q, k, v, d**-0.5, mask))


def test_inputs_not_contiguous_in_the_last_dimension_are_read_right(isa: str) -> None:
    q, k, v = qkv(2, 4, 2, 40, 60, seed=9)
    qt, kt, vt = (mx.swapaxes(mx.swapaxes(a, 2, 3) + 0, 2, 3) for a in (q, k, v))
    close(fused(qt, kt, vt, 0.125, "causal"), reference(q, k, v, 0.125, "causal"))


def test_bad_inputs_raise_value_errors() -> None:
    ext = qmm.extension()
    q, k, v = qkv(2, 9, 3, 10, 12)
    bad = [
        ((q.astype(mx.float16), k, v), "float32"),
        ((q[..., 0, :], k, v), "4-D"),
        ((q[:1], k, v), "batch size"),
        ((q[:, :8], k, v), "divides"),
        ((q, k, v[:, :, :5]), "length"),
        ((q[..., :32], k, v), "head dim"),
    ]
    for args, message in bad:
        with pytest.raises(ValueError, match=message):
            ext.sdpa_prefill(*args, 0.125, True)
    for mask in (
        mx.ones((2, 1, 10, 12)),  # not bool
        mx.ones((2, 1, 10, 11), dtype=mx.bool_),  # the wrong key count
        mx.ones((3, 1, 10, 12), dtype=mx.bool_),  # the wrong batch
        mx.ones((2, 9, 10, 12), dtype=mx.bool_),  # per head
    ):
        with pytest.raises(ValueError, match="sdpa_prefill: mask"):
            ext.sdpa_prefill(q, k, v, 0.125, False, mask)


def test_the_wrapper_routes_long_chunks_to_the_fused_kernel(threaded: None) -> None:
    """From FUSED_MIN_QUERIES queries the swapped function gives the fused kernel's bits;
    below, with the switch off, and on the kernel's portable loops (no AVX2: slower than
    BLAS), MLX's products around the extension's softmax."""
    n = attention.FUSED_MIN_QUERIES
    tiled = qmm.extension().isa() in ("avx512", "avx2")  # else not routed at all
    for m, want_fused in ((n, tiled), (n - 1, False)):
        q, k, v = qkv(2, 9, 3, m, m + 20, seed=m)
        mask = padded_mask(m, m + 20, [0, 4])
        for mask_arg in ("causal", mask):
            got = attention.scaled_dot_product_attention(q, k, v, None, 0.125, mask_arg)
            assert same_bits(got, fused(q, k, v, 0.125, mask_arg)) == want_fused
            close(got, reference(q, k, v, 0.125, mask_arg))
    q, k, v = qkv(1, 9, 3, 2 * n, 2 * n, seed=1)
    attention.use_fused_prefill(False)
    try:
        got = attention.scaled_dot_product_attention(q, k, v, None, 0.125, "causal")
        assert not same_bits(got, fused(q, k, v, 0.125, "causal"))
        close(got, reference(q, k, v, 0.125, "causal"))
    finally:
        attention.use_fused_prefill(True)
    qmm.extension().set_isa("scalar")
    try:
        got = attention.scaled_dot_product_attention(q, k, v, None, 0.125, "causal")
        assert not same_bits(got, fused(q, k, v, 0.125, "causal"))
        close(got, reference(q, k, v, 0.125, "causal"))
    finally:
        qmm.extension().set_isa("best")
