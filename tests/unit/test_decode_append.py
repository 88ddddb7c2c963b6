"""A decode step's cache update inside its attention node (`sdpa_decode_append`,
kernels/attn_append.cpp; models/cpu/decoder.py): the bits and the cache contents of
mlx_lm's update_and_fetch plus the attention call, the cache's buffer reused when nothing
else holds it and left alone when something does, and mlx_lm's path wherever the node
does not do what update_and_fetch would."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import KVCache

from tests.support.tiny_model import tiny_llama
from tests.unit.test_decoder_layer import decode, prepared
from vllm_mlx.engine.cache.rows import BatchKVCache, KVQuantization
from vllm_mlx.models.cpu import attention, decoder, qmm

BUILT = qmm.status().available and hasattr(qmm.extension(), "sdpa_decode_append")
pytestmark = pytest.mark.skipif(not BUILT, reason=f"kernel unavailable: {qmm.status().detail}")
B, HQ, HKV, S, D = 3, 6, 2, 16, 32
SCALE = D**-0.5


@pytest.fixture(autouse=True)
def paths_restored() -> Iterator[None]:
    swapped = attention.uses_kernel(tiny_llama())
    yield
    decoder.use_fused_layers(True)
    decoder.use_appended_attention(True)
    if not swapped:
        attention.restore_attention(tiny_llama())


def normal(shape: tuple[int, ...], seed: int) -> mx.array:
    a = mx.random.normal(shape, key=mx.random.key(seed))
    mx.eval(a)
    return a


def address(a: mx.array) -> int:
    return int(np.asarray(a).__array_interface__["data"][0])


def reference(
    q: mx.array, k: mx.array, v: mx.array, kc: mx.array, vc: mx.array, at: int, mask: Any
) -> tuple[mx.array, mx.array, mx.array]:
    """What mlx_lm's cache and attention.py do: two slice updates, two slices, the kernel."""
    keys, values = mx.array(kc), mx.array(vc)
    keys[..., at : at + 1, :] = k
    values[..., at : at + 1, :] = v
    ext = qmm.extension()
    out = ext.sdpa_decode(q, keys[..., : at + 1, :], values[..., : at + 1, :], SCALE, mask)
    return out, keys, values


LEFT_PADDED = mx.array([True] * 8 + [False] * 3 + [True] * 5).reshape(1, 1, 1, 16)


@pytest.mark.parametrize("at", [0, 7, S - 1])
@pytest.mark.parametrize("masked", [False, True])
def test_the_bits_and_the_caches_of_the_update_and_the_attention(at: int, masked: bool) -> None:
    q, k, v = normal((B, HQ, 1, D), 1), normal((B, HKV, 1, D), 2), normal((B, HKV, 1, D), 3)
    kc, vc = normal((B, HKV, S, D), 4), normal((B, HKV, S, D), 5)
    mask = mx.broadcast_to(LEFT_PADDED[..., : at + 1], (B, 1, 1, at + 1)) if masked else None
    want = reference(q, k, v, kc, vc, at, mask)
    # kc and vc stay held here: the node copies them, and leaves these as they were.
    before = np.array(kc), np.array(vc)
    got = qmm.extension().sdpa_decode_append(q, k, v, kc, vc, at, SCALE, mask)
    mx.eval(got, want)
    for have, expected in zip(got, want, strict=True):
        assert mx.array_equal(have, expected).item()
    assert np.array_equal(np.array(kc), before[0]) and np.array_equal(np.array(vc), before[1])


@pytest.mark.parametrize(
    "view",
    [
        lambda a: a[..., 3:, :],  # a batch cache after its left padding is dropped
        lambda a: a[::2],  # every other row: runs of a whole row apart
        lambda a: a.transpose(1, 0, 2, 3),  # heads outermost: no two dimensions row-major
    ],
)
def test_a_cache_laid_out_otherwise_is_copied_with_its_values(view: Any) -> None:
    """A cache buffer that is a strided view (not row-major) is copied into the node's
    new buffer in row-major order, element for element."""
    big_k, big_v = normal((2 * B, HKV, S + 3, D), 4), normal((2 * B, HKV, S + 3, D), 5)
    kc, vc = view(big_k), view(big_v)
    rows, heads, positions = kc.shape[0], kc.shape[1], kc.shape[2]
    q = normal((rows, heads * (HQ // HKV), 1, D), 1)
    k, v = normal((rows, heads, 1, D), 2), normal((rows, heads, 1, D), 3)
    at = positions - 2
    want = reference(q, k, v, mx.contiguous(kc), mx.contiguous(vc), at, None)
    got = qmm.extension().sdpa_decode_append(q, k, v, kc, vc, at, SCALE)
    mx.eval(got, want)
    for have, expected in zip(got, want, strict=True):
        assert mx.array_equal(have, expected).item()


def test_a_cache_nothing_else_holds_is_written_in_place() -> None:
    q, k, v = normal((B, HQ, 1, D), 1), normal((B, HKV, 1, D), 2), normal((B, HKV, 1, D), 3)
    kc, vc = normal((B, HKV, S, D), 4), normal((B, HKV, S, D), 5)
    first = address(kc)
    for at in range(3, 9):  # step after step, as a decode loop builds them
        out, kc, vc = qmm.extension().sdpa_decode_append(q, k, v, kc, vc, at, SCALE)
        mx.eval(out)
    assert address(kc) == first


def test_the_op_refuses_what_it_cannot_compute() -> None:
    ext = qmm.extension()
    q, k, v = mx.zeros((B, HQ, 1, D)), mx.zeros((B, HKV, 1, D)), mx.zeros((B, HKV, 1, D))
    kc, vc = mx.zeros((B, HKV, S, D)), mx.zeros((B, HKV, S, D))

    def call(**kw: Any) -> Any:
        args: dict[str, Any] = dict(
            q=q, k=k, v=v, k_cache=kc, v_cache=vc, position=3, scale=SCALE
        )  # fmt: skip
        args.update(kw)
        return ext.sdpa_decode_append(**args)

    assert [a.shape for a in call()] == [(B, HQ, 1, D), kc.shape, vc.shape]
    for bad, match in [
        ({"position": S}, "position must be in \\[0, 16\\)"),
        ({"position": -1}, "position must be in"),
        ({"q": mx.zeros((B, HQ, 2, D))}, "one position"),
        ({"k_cache": mx.zeros((B, HKV + 1, S, D))}, "must hold k's and v's"),
        ({"v_cache": mx.zeros((B, HKV, S + 1, D))}, "must hold k's and v's"),
        ({"k_cache": mx.zeros((B, HKV, S, D), dtype=mx.float16)}, "4-D float32"),
        ({"mask": mx.ones((B, 1, 1, 9), dtype=mx.bool_)}, "must broadcast"),
    ]:
        with pytest.raises(ValueError, match=match):
            call(**bad)


def engine_caches(model: Any, padding: list[int], quant: KVQuantization | None = None) -> Any:
    return [BatchKVCache(padding, quant=quant) for _ in model.layers]


PADDED = mx.array([[0, 0, 12, 40, 3], [7, 7, 1, 2, 60], [0, 4, 33, 8, 21]])


def decoded(model: Any, appended: bool, make_cache: Any) -> tuple[tuple[mx.array, ...], Any]:
    decoder.use_appended_attention(appended)
    cache = make_cache()
    return decode(model, PADDED, 6, cache), cache


def test_the_engines_batch_cache_takes_the_node_with_the_same_bits_and_contents(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = prepared()
    assert decoder.swap_decoder_layers(model) == len(model.layers)
    commits = []
    original = decoder._commit
    monkeypatch.setattr(decoder, "_commit", lambda *a: commits.append(1) or original(*a))
    appended, cache_a = decoded(model, True, lambda: engine_caches(model, [2, 0, 1]))
    assert len(commits) == 6 * len(model.layers)
    plain, cache_b = decoded(model, False, lambda: engine_caches(model, [2, 0, 1]))
    assert len(commits) == 6 * len(model.layers)
    assert all(mx.array_equal(a, b).item() for a, b in zip(appended, plain, strict=True))
    for a, b in zip(cache_a, cache_b, strict=True):
        assert a._idx == b._idx and mx.array_equal(a.offset, b.offset).item()
        for x, y in zip(a.keys_and_values(), b.keys_and_values(), strict=True):
            assert mx.array_equal(x, y).item()


def test_mlx_lms_plain_cache_takes_the_node_with_the_same_bits() -> None:
    model = prepared()
    assert decoder.swap_decoder_layers(model) == len(model.layers)
    appended, cache = decoded(model, True, lambda: [KVCache() for _ in model.layers])
    plain, _ = decoded(model, False, lambda: [KVCache() for _ in model.layers])
    assert all(mx.array_equal(a, b).item() for a, b in zip(appended, plain, strict=True))
    assert cache[0].offset == 5 + 6


def test_a_cache_the_node_must_not_write_says_so() -> None:
    """No buffer yet, a full one, one quantized now or from this step on, right padding
    not rolled away: update_and_fetch's own work (it grows, quantizes, rolls)."""
    layer = BatchKVCache([0, 0])
    assert layer.decode_slot() is None  # no buffer yet
    layer.update_and_fetch(mx.zeros((2, 2, 5, 8)), mx.zeros((2, 2, 5, 8)))
    assert layer.decode_slot() == 5
    layer.update_and_fetch(mx.zeros((2, 2, 251, 8)), mx.zeros((2, 2, 251, 8)))
    assert layer.decode_slot() is None  # 256 of 256 positions used: it grows
    quantizing = BatchKVCache([0, 0], quant=KVQuantization(bits=8, quantized_after=6))
    quantizing.update_and_fetch(mx.zeros((2, 2, 5, 64)), mx.zeros((2, 2, 5, 64)))
    assert quantizing.decode_slot() is None  # the next step quantizes it
    later = BatchKVCache([0, 0], quant=KVQuantization(bits=8, quantized_after=64))
    later.update_and_fetch(mx.zeros((2, 2, 5, 64)), mx.zeros((2, 2, 5, 64)))
    assert later.decode_slot() == 5
    padded = BatchKVCache([0, 0])
    padded.prepare(right_padding=[0, 2])
    padded.update_and_fetch(mx.zeros((2, 2, 5, 8)), mx.zeros((2, 2, 5, 8)))
    assert padded.decode_slot() is None


def test_attention_not_routed_to_the_extension_keeps_mlx_lms_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The node computes attention.py's decode call: with MLX's own attention in the
    model module (benchmarks and tests restore it), the layer calls that instead."""
    model = prepared()
    assert decoder.swap_decoder_layers(model) == len(model.layers)
    attention.restore_attention(model)
    commits = []
    original = decoder._commit
    monkeypatch.setattr(decoder, "_commit", lambda *a: commits.append(1) or original(*a))
    decode(model, PADDED, 2, engine_caches(model, [2, 0, 1]))
    assert commits == []
