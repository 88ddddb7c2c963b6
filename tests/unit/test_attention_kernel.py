"""The extension's decode attention against mx.fast.scaled_dot_product_attention, and the
swap of mlx_lm's attention function around it (models/attention.py)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models import base, llama
from mlx_lm.models.cache import BatchKVCache, make_prompt_cache

from vllm_mlx.models.cpu import attention, qmm

BUILT = attention.available()
pytestmark = pytest.mark.skipif(not BUILT, reason=f"kernel unavailable: {qmm.status().detail}")
NAME = "scaled_dot_product_attention"
TOL = 2e-5  # BLAS sums in another order: rounding, never more


def qkv(
    b: int, hq: int, hkv: int, d: int, t: int, dv: int | None = None, seed: int = 0
) -> tuple[mx.array, mx.array, mx.array]:
    """q, and k and v as slices of a longer cache buffer, as mlx_lm's KVCache returns them."""
    dv = d if dv is None else dv
    q = mx.random.normal((b, hq, 1, d), key=mx.random.key(seed))
    keys = mx.random.normal((b, hkv, t + 37, d), key=mx.random.key(seed + 1))
    values = mx.random.normal((b, hkv, t + 37, dv), key=mx.random.key(seed + 2))
    return q, keys[..., :t, :], values[..., :t, :]


def masks(b: int, hq: int, t: int) -> list[mx.array | None]:
    keep = mx.random.uniform(shape=(b, 1, 1, t), key=mx.random.key(t)) > 0.3
    per_head = mx.random.uniform(shape=(b, hq, 1, t), key=mx.random.key(t + 1)) > 0.5
    return [None, keep, per_head, mx.where(keep, 0.0, -1e9), mx.where(per_head, 0.5, -3.0)]


def close(got: mx.array, want: mx.array) -> None:
    assert got.shape == want.shape and got.dtype == mx.float32
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=TOL, atol=TOL)


def same_bits(got: mx.array, want: mx.array) -> bool:
    return bool((np.array(got).view(np.uint32) == np.array(want).view(np.uint32)).all())


def reference(
    q: mx.array, k: mx.array, v: mx.array, scale: float, mask: mx.array | None
) -> mx.array:
    return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)


SHAPES = [  # (B, Hq, Hkv, D, T, Dv): GQA 9/3 as the bundled model, MHA, MQA, odd tails
    (1, 9, 3, 64, 1, 64),
    (2, 9, 3, 64, 37, 64),
    (5, 9, 3, 64, 255, 64),
    (3, 4, 4, 128, 700, 128),
    (1, 8, 1, 64, 129, 64),
    (2, 8, 1, 128, 16, 128),
    (2, 6, 2, 72, 41, 40),
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_matches_mlx_for_every_shape_and_mask(isa: str, shape: tuple[int, ...]) -> None:
    b, hq, hkv, d, t, dv = shape
    q, k, v = qkv(b, hq, hkv, d, t, dv, seed=t)
    for mask in masks(b, hq, t):
        got = qmm.extension().sdpa_decode(q, k, v, d**-0.5, mask)
        close(got, reference(q, k, v, d**-0.5, mask))


def test_all_masked_rows_stay_finite_like_mlx(isa: str) -> None:
    """MLX masks with finfo.min, not -inf: a row with nothing to attend averages V."""
    q, k, v = qkv(3, 9, 3, 64, 20)
    keep = mx.array([True] * 20)[None] & mx.array([[True], [False], [True]])
    mask = keep.reshape(3, 1, 1, 20)
    got = qmm.extension().sdpa_decode(q, k, v, 0.125, mask)
    assert bool(mx.isfinite(got).all().item())
    close(got, reference(q, k, v, 0.125, mask))
    close(got[1], mx.repeat(v[1].mean(axis=1, keepdims=True), 3, axis=0))


def test_left_padding_mask_of_a_batch_cache(isa: str) -> None:
    """The mask mlx_lm's BatchKVCache makes for a decode step (left-padded prompts)."""
    cache = BatchKVCache([0, 3, 5])
    k = mx.random.normal((3, 3, 12, 64), key=mx.random.key(5))
    v = mx.random.normal((3, 3, 12, 64), key=mx.random.key(6))
    cache.update_and_fetch(k, v)
    mask = cache.make_mask(1)  # as the model does: before the step's keys are added
    keys, values = cache.update_and_fetch(k[:, :, :1], v[:, :, :1])
    assert isinstance(mask, mx.array) and not bool(mask.all().item())
    q = mx.random.normal((3, 9, 1, 64), key=mx.random.key(7))
    got = qmm.extension().sdpa_decode(q, keys, values, 0.125, mask)
    close(got, reference(q, keys, values, 0.125, mask))


def test_large_scores_and_extreme_values(isa: str) -> None:
    q, k, v = qkv(2, 4, 2, 64, 50)
    for scale in (8.0, 1e-6):
        close(qmm.extension().sdpa_decode(q, k, v, scale), reference(q, k, v, scale, None))


def test_threads_and_batch_give_each_row_the_same_bits(isa: str, threaded: None) -> None:
    """A sequence alone (one thread) and inside a batch split over threads: bit for bit."""
    ext = qmm.extension()
    q, k, v = qkv(5, 9, 3, 64, 133)
    mask = masks(5, 9, 133)[1]
    assert mask is not None
    batch = ext.sdpa_decode(q, k, v, 0.125, mask)
    ext.set_threads(1)
    for i in range(5):
        alone = ext.sdpa_decode(q[i : i + 1], k[i : i + 1], v[i : i + 1], 0.125, mask[i : i + 1])
        assert same_bits(alone, batch[i : i + 1]), i


@pytest.mark.parametrize("d", [64, 128, 72])
def test_a_key_scores_the_same_bits_in_a_block_of_16_or_alone(isa: str, d: int) -> None:
    """Scores are summed 16 keys at a time on AVX-512 (head dims 64 and 128), 8 on AVX2
    (head dims a multiple of 8), and key by key after the last whole block. Where the
    blocks start follows the first key any head keeps, so another head's mask moves keys
    32-34 of head 0 from a block to the tail (AVX-512) or to another block (AVX2): its
    output keeps its bits."""
    q, k, v = qkv(1, 2, 1, d, 40, seed=d)
    from_3 = mx.arange(40) >= 3
    both_from_3 = mx.stack([from_3, from_3]).reshape(1, 2, 1, 40)
    only_head_0 = mx.stack([from_3, mx.ones(40, dtype=mx.bool_)]).reshape(1, 2, 1, 40)
    ext = qmm.extension()
    blocked = ext.sdpa_decode(q, k, v, d**-0.5, both_from_3)  # head 0's keys 3-34 in blocks
    tail = ext.sdpa_decode(q, k, v, d**-0.5, only_head_0)  # keys 0-31 in blocks, 32-39 not
    assert same_bits(blocked[:, :1], tail[:, :1])
    close(blocked, reference(q, k, v, d**-0.5, both_from_3))


@pytest.mark.parametrize(
    "shape",
    [(1, 9, 3, 64, 1500, 64, 1), (1, 9, 3, 64, 1100, 64, 4), (3, 4, 1, 128, 1030, 40, 1)],
    ids=lambda s: "x".join(map(str, s)),
)
def test_threads_sharing_a_few_long_units_keep_the_bits(
    isa: str, threaded: None, shape: tuple[int, ...]
) -> None:
    """Fewer (sequence, KV head) units than the threads can split evenly, over 1,000+
    positions: the threads share each unit's scores, softmax and P.V columns. Bit for bit
    the one-thread result, for every mask kind and a causal chunk of positions."""
    b, hq, hkv, d, t, dv, m = shape
    ext = qmm.extension()
    q = mx.random.normal((b, hq, m, d), key=mx.random.key(t))
    _, k, v = qkv(b, hq, hkv, d, t, dv, seed=t)
    cases = [(mask, False) for mask in masks(b, hq, t)] + [(None, True)] * (m > 1)
    for mask, causal in cases:
        shared = ext.sdpa_decode(q, k, v, d**-0.5, mask, causal=causal)
        ext.set_threads(1)
        alone = ext.sdpa_decode(q, k, v, d**-0.5, mask, causal=causal)
        ext.set_threads(2)
        assert same_bits(shared, alone), (mask is None, causal)
        want = reference(q, k, v, d**-0.5, "causal" if causal else mask)  # type: ignore[arg-type]
        close(shared, want)


def test_inputs_not_contiguous_in_the_last_dimension_are_read_right(isa: str) -> None:
    q, k, v = qkv(2, 4, 2, 64, 30)
    kt = mx.swapaxes(mx.swapaxes(k, 2, 3) + 0, 2, 3)  # last-dimension stride != 1
    vt = mx.swapaxes(mx.swapaxes(v, 2, 3) + 0, 2, 3)
    qt = mx.swapaxes(mx.swapaxes(q, 2, 3) + 0, 2, 3)
    close(qmm.extension().sdpa_decode(qt, kt, vt, 0.125), reference(q, k, v, 0.125, None))


def test_bad_inputs_raise_value_errors() -> None:
    ext = qmm.extension()
    q, k, v = qkv(2, 9, 3, 64, 10)
    bad = [
        ((q.astype(mx.float16), k, v), "float32"),
        ((q[..., 0, :], k, v), "4-D"),
        ((mx.concatenate([q] * 65, axis=2), k, v), "1 to 64 positions"),
        ((q[:1], k, v), "batch size"),
        ((q[:, :8], k, v), "divides"),
        ((q, k, v[:, :, :5]), "length"),
        ((q, k[..., :0, :], v[..., :0, :]), "length"),
        ((q[..., :32], k, v), "head dim"),
    ]
    for args, message in bad:
        with pytest.raises(ValueError, match=message):
            ext.sdpa_decode(*args, 0.125)
    with pytest.raises(ValueError, match="broadcast"):
        ext.sdpa_decode(q, k, v, 0.125, mx.ones((2, 1, 1, 11), dtype=mx.bool_))
    with pytest.raises(ValueError, match="bool or floating"):
        ext.sdpa_decode(q, k, v, 0.125, mx.ones((2, 1, 1, 10), dtype=mx.int32))
    with pytest.raises(ValueError, match="exclude each other"):
        ext.sdpa_decode(q, k, v, 0.125, mx.ones((2, 1, 1, 10), dtype=mx.bool_), causal=True)
    assert ext.SDPA_DECODE_MAX_QUERIES == 64


def several(b: int, m: int, t: int, seed: int = 0) -> tuple[mx.array, mx.array, mx.array]:
    """m query positions, the last m of t keys (cache slices, as qkv), GQA 9 / 3."""
    q = mx.random.normal((b, 9, m, 64), key=mx.random.key(seed))
    _, k, v = qkv(b, 9, 3, 64, t, seed=seed)
    return q, k, v


@pytest.mark.parametrize(("m", "t"), [(2, 2), (3, 40), (7, 300), (16, 129), (64, 700)])
def test_several_positions_match_mlx_causal_and_masked(isa: str, m: int, t: int) -> None:
    """A short chunk or a verify pass at offset t - m: causal, and the masks of a
    left-padded batch cache (bool, and as additive), against MLX."""
    q, k, v = several(2, m, t, seed=m)
    ext = qmm.extension()
    close(ext.sdpa_decode(q, k, v, 0.125, causal=True), reference(q, k, v, 0.125, "causal"))  # type: ignore[arg-type]
    keep = base.create_causal_mask(m, offset=t - m, left_padding=mx.array([0, min(3, t - m)]))
    for mask in (keep, mx.where(keep, 0.0, -1e9), None):
        close(ext.sdpa_decode(q, k, v, 0.125, mask), reference(q, k, v, 0.125, mask))


def test_a_position_that_sees_no_key_averages_v_like_mlx(isa: str) -> None:
    """More positions than keys, causal: the first sees none; MLX gives it V's mean."""
    q, k, v = several(1, 5, 3)
    got = qmm.extension().sdpa_decode(q, k, v, 0.125, causal=True)
    close(got, reference(q, k, v, 0.125, "causal"))  # type: ignore[arg-type]
    close(got[:, :, 0], mx.repeat(v.mean(axis=2), 3, axis=1))


@pytest.mark.parametrize("m", [2, 5, 12])
def test_each_position_has_the_bits_of_its_own_decode_call(
    isa: str, m: int, threaded: None
) -> None:
    """Position j of a causal (or batch-cache masked) call is bit for bit a one-position
    call over the keys it sees: what a speculative verify pass relies on."""
    t = 90 + m
    q, k, v = several(3, m, t, seed=m)
    ext = qmm.extension()
    mask = base.create_causal_mask(m, offset=t - m, left_padding=mx.array([0, 4, 9]))
    rows = {"causal": ext.sdpa_decode(q, k, v, 0.125, causal=True)}
    rows["mask"] = ext.sdpa_decode(q, k, v, 0.125, mask)
    for j in range(m):
        seen = t - m + j + 1
        alone = ext.sdpa_decode(q[:, :, j : j + 1], k[..., :seen, :], v[..., :seen, :], 0.125)
        assert same_bits(alone, rows["causal"][:, :, j : j + 1]), j
        step = ext.sdpa_decode(
            q[:, :, j : j + 1],
            k[..., :seen, :],
            v[..., :seen, :],
            0.125,
            mask[..., j : j + 1, :seen],
        )
        assert same_bits(step, rows["mask"][:, :, j : j + 1]), j


def tiny_llama() -> llama.Model:
    args = llama.ModelArgs(
        model_type="llama",
        hidden_size=128,
        num_hidden_layers=2,
        intermediate_size=256,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-5,
        vocab_size=100,
    )
    model = llama.Model(args)
    mx.eval(model.parameters())
    return model


def test_swap_routes_decode_steps_and_is_idempotent_and_reversible() -> None:
    model = tiny_llama()
    attention.restore_attention(model)
    try:
        tokens = mx.array([[1, 5, 9, 3, 7]])
        caches = [make_prompt_cache(model), make_prompt_cache(model)]
        want_prefill = model(tokens, cache=caches[0])
        want = model(mx.array([[4]]), cache=caches[0])
        assert attention.swap_attention(model) == 1 and attention.swap_attention(model) == 1
        assert llama.__dict__[NAME] is attention.scaled_dot_product_attention
        assert attention.uses_kernel(model)
        # Prefill (5 positions): the fused prefill kernel, MLX's fallback to rounding.
        close(model(tokens, cache=caches[1]), want_prefill)
        close(model(mx.array([[4]]), cache=caches[1]), want)
    finally:
        assert attention.restore_attention(model) == 1
    assert llama.__dict__[NAME] is base.scaled_dot_product_attention
    assert not attention.uses_kernel(model)


def test_the_wrapper_leaves_other_cases_to_mlx_lm() -> None:
    q, k, v = qkv(1, 4, 2, 64, 9)
    half = q.astype(mx.float16), k.astype(mx.float16), v.astype(mx.float16)
    cases: list[tuple[tuple[mx.array, ...], mx.array | str | None, mx.array | None]] = [
        ((q, k, v), None, mx.zeros((4,))),  # attention sinks
        (half, "causal", None),  # not float32
        (half, None, None),
    ]
    for (qq, kk, vv), mask, sinks in cases:
        got = attention.scaled_dot_product_attention(qq, kk, vv, None, 0.125, mask, sinks)
        want = base.scaled_dot_product_attention(qq, kk, vv, None, 0.125, mask, sinks)  # type: ignore[arg-type]
        assert same_bits(got, want)


def prefill_qkv(
    b: int, hq: int, hkv: int, m: int, t: int, seed: int = 0
) -> tuple[mx.array, mx.array, mx.array]:
    q = mx.random.normal((b, hq, m, 64), key=mx.random.key(seed))
    k = mx.random.normal((b, hkv, t, 64), key=mx.random.key(seed + 1))
    v = mx.random.normal((b, hkv, t, 64), key=mx.random.key(seed + 2))
    return q, k, v


PREFILL_SHAPES = [(1, 9, 3, 7, 7), (1, 9, 3, 40, 300), (2, 4, 4, 33, 65), (1, 2, 1, 512, 1024)]


@pytest.mark.parametrize(("b", "hq", "hkv", "m", "t"), PREFILL_SHAPES)
def test_prefill_matches_mlx_causal_and_masked(
    b: int, hq: int, hkv: int, m: int, t: int, threaded: None
) -> None:
    """A chunk of m queries at offset t - m: causal (one sequence) and the left-padded
    bool mask of a batch cache, against mlx_lm's own function."""
    q, k, v = prefill_qkv(b, hq, hkv, m, t)
    masks: list[mx.array | str | None] = [
        "causal",
        base.create_causal_mask(m, offset=t - m, left_padding=mx.array([0, 5][:b])),
        None,
    ]
    for mask in masks:
        got = attention.scaled_dot_product_attention(q, k, v, None, 0.125, mask)
        want = base.scaled_dot_product_attention(q, k, v, None, 0.125, mask)  # type: ignore[arg-type]
        close(got, want)


def test_prefill_rows_with_every_key_masked_are_uniform_like_mlx() -> None:
    """A left-padded sequence's padding queries see no key: MLX gives each key 1/t."""
    q, k, v = prefill_qkv(2, 4, 2, 6, 6)
    mask = base.create_causal_mask(6, offset=0, left_padding=mx.array([0, 4]))
    got = attention.scaled_dot_product_attention(q, k, v, None, 0.125, mask)
    want = base.scaled_dot_product_attention(q, k, v, None, 0.125, mask)  # type: ignore[arg-type]
    assert bool(mx.all(mx.isfinite(got)).item())
    close(got, want)


def test_prefill_softmax_refuses_bad_inputs() -> None:
    ext = qmm.extension()
    scores = mx.zeros((1, 2, 6, 8))
    bad = [
        (mx.zeros((1, 2, 6, 8), dtype=mx.float16), 3, None),  # not float32
        (scores, 4, None),  # rows not a multiple of M
        (scores, 3, mx.zeros((1, 1, 3, 8))),  # a float mask
        (scores, 3, mx.zeros((1, 1, 3, 7), dtype=mx.bool_)),  # the wrong key count
        (scores, 3, mx.zeros((3, 1, 3, 8), dtype=mx.bool_)),  # the wrong batch
    ]
    for array, rows, mask in bad:
        with pytest.raises(ValueError, match="softmax_prefill"):
            ext.softmax_prefill(array, rows, False, mask)


def test_the_prefill_kernel_can_be_switched_off() -> None:
    q, k, v = prefill_qkv(1, 4, 2, 9, 9)
    want = base.scaled_dot_product_attention(q, k, v, None, 0.125, "causal")  # type: ignore[arg-type]
    attention.use_prefill_kernel(False)
    try:
        got = attention.scaled_dot_product_attention(q, k, v, None, 0.125, "causal")
        assert same_bits(got, want)  # mlx_lm's own path
    finally:
        attention.use_prefill_kernel(True)


def test_short_chunks_go_to_the_decode_kernel_and_longer_ones_do_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Up to SHORT_CHUNK_QUERIES queries: the decode kernel's bits (causal and masked);
    one more: the fused prefill kernel's (another order of sums, so other bits)."""
    ext = qmm.extension()
    calls: list[int] = []
    original = ext.sdpa_decode

    def counted(q: mx.array, *args: object, **kw: object) -> mx.array:
        calls.append(q.shape[2])
        return original(q, *args, **kw)  # type: ignore[no-any-return]

    monkeypatch.setattr(ext, "sdpa_decode", counted)
    n = attention.SHORT_CHUNK_QUERIES
    for m in (2, n, n + 1):
        q, k, v = several(2, m, 50 + m, seed=m)
        mask = base.create_causal_mask(m, offset=50, left_padding=mx.array([0, 2]))
        for kind in ("causal", mask):
            got = attention.scaled_dot_product_attention(q, k, v, None, 0.125, kind)
            want = base.scaled_dot_product_attention(q, k, v, None, 0.125, kind)  # type: ignore[arg-type]
            close(got, want)
    assert calls == [2, 2, n, n]
    # Without the fused kernel's register tiles, the decode kernel keeps chunks of up to
    # DECODE_KERNEL_CHUNK_QUERIES (the BLAS products take longer ones).
    wide = attention.DECODE_KERNEL_CHUNK_QUERIES
    calls.clear()
    qmm.extension().set_isa("scalar")
    try:
        for m in (n + 1, wide, wide + 1):
            q, k, v = several(2, m, 50 + m, seed=m)
            got = attention.scaled_dot_product_attention(q, k, v, None, 0.125, "causal")
            close(got, base.scaled_dot_product_attention(q, k, v, None, 0.125, "causal"))
    finally:
        qmm.extension().set_isa("best")
    assert calls == [n + 1, wide]
    calls[:] = [2, 2, n, n]
    attention.use_prefill_kernel(False)
    try:
        q, k, v = several(1, 2, 9)
        got = attention.scaled_dot_product_attention(q, k, v, None, 0.125, "causal")
        assert same_bits(got, base.scaled_dot_product_attention(q, k, v, None, 0.125, "causal"))
    finally:
        attention.use_prefill_kernel(True)
    assert calls == [2, 2, n, n]


def test_attend_as_decoding_is_one_call_with_each_positions_decode_bits() -> None:
    """What a speculative verify pass uses: a batch cache's mask over several positions,
    bit for bit the one-position calls; None where it cannot promise that."""
    m, t = 6, 70
    q, k, v = several(3, m, t, seed=3)
    mask = base.create_causal_mask(m, offset=t - m, left_padding=mx.array([0, 1, 8]))
    got = attention.attend_as_decoding(q, k, v, None, 0.125, mask)
    assert got is not None
    for j in range(m):
        seen = t - m + j + 1
        step = attention.scaled_dot_product_attention(
            q[:, :, j : j + 1],
            k[..., :seen, :],
            v[..., :seen, :],
            None,
            0.125,
            mask[..., j : j + 1, :seen],
        )
        assert same_bits(step, got[:, :, j : j + 1]), j
    assert attention.attend_as_decoding(q, k, v, None, 0.125, "causal") is None
    assert attention.attend_as_decoding(q.astype(mx.float16), k, v, None, 0.125, mask) is None
    wide = mx.concatenate([q] * 11, axis=2)  # 66 positions: more than the kernel takes
    assert attention.attend_as_decoding(wide, k, v, None, 0.125, mask) is None


@pytest.mark.parametrize("pad", [1, 5, 16, 37])
def test_left_padding_leaves_a_rows_bits_as_alone(isa: str, pad: int) -> None:
    """A row behind `pad` positions its bool mask excludes (a batch cache's left padding,
    a row moved right by a speculative rewind) gets the bits it gets alone."""
    q, k, v = qkv(1, 9, 3, 64, 150, seed=pad)
    junk = mx.random.normal((1, 3, pad, 64), key=mx.random.key(99))
    keep = mx.concatenate([mx.zeros((pad,), mx.bool_), mx.ones((150,), mx.bool_)])
    ext = qmm.extension()
    alone = ext.sdpa_decode(q, k, v, 0.125)
    padded = ext.sdpa_decode(
        q,
        mx.concatenate([junk, k], axis=2),
        mx.concatenate([junk, v], axis=2),
        0.125,
        keep.reshape(1, 1, 1, -1),
    )
    assert same_bits(padded, alone)


@pytest.mark.parametrize("positions", [1, 3])
def test_left_padding_is_never_read(isa: str, positions: int) -> None:
    """A batch row's left padding is skipped, not multiplied by zero: NaN there (which any
    read would spread through P.V) changes no bit of any row. Rows with different
    padding in one batch, several query positions, a mask per head."""
    q = mx.random.normal((3, 9, positions, 64), key=mx.random.key(5))
    k = mx.random.normal((3, 3, 90, 64), key=mx.random.key(6))
    v = mx.random.normal((3, 3, 90, 64), key=mx.random.key(7))
    pads = [0, 17, 61]
    starts = mx.array(pads).reshape(3, 1, 1, 1)
    position = mx.arange(90).reshape(1, 1, 1, -1)
    keep = mx.broadcast_to(position >= starts, (3, 9, positions, 90))
    # one head of row 1 starts later still: its block's first key is the smallest one
    late = (mx.arange(9).reshape(1, 9, 1, 1) == 4) & (mx.arange(3).reshape(3, 1, 1, 1) == 1)
    keep = keep & ~(late & (position < 40))
    blank = mx.arange(90).reshape(1, 1, -1, 1) < starts  # K and V: positions on axis 2
    nan_k, nan_v = mx.where(blank, mx.nan, k), mx.where(blank, mx.nan, v)
    ext = qmm.extension()
    clean = ext.sdpa_decode(q, k, v, 0.125, keep)
    poisoned = ext.sdpa_decode(q, nan_k, nan_v, 0.125, keep)
    assert not np.isnan(np.array(poisoned)).any()
    assert same_bits(poisoned, clean)
    for row, pad in enumerate(pads):  # and each row has its bits alone, unpadded
        alone = ext.sdpa_decode(
            q[row : row + 1], k[row : row + 1, :, pad:], v[row : row + 1, :, pad:], 0.125,
            keep[row : row + 1, :, :, pad:],
        )  # fmt: skip
        assert same_bits(poisoned[row : row + 1], alone), row
