"""The extension's rms_norm and rope against mx.fast's (bit for bit), and the module swap."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx_lm.models import llama
from mlx_lm.models.cache import make_prompt_cache

from tests.support.tiny_model import tiny_llama
from vllm_mlx.models.cpu import norms as fused_norms
from vllm_mlx.models.cpu import qmm

BUILT = qmm.status().available
pytestmark = pytest.mark.skipif(not BUILT, reason=f"kernel unavailable: {qmm.status().detail}")

LLAMA3 = {
    "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}  # fmt: skip


def same(got: mx.array, want: mx.array) -> bool:
    return got.shape == want.shape and bool(mx.array_equal(got, want, equal_nan=True).item())


@pytest.mark.parametrize("shape", [(1, 1, 576), (3, 7, 576), (2, 5, 17), (4, 1, 1), (5, 1536)])
@pytest.mark.parametrize("scale", [1e-3, 1.0, 40.0])
def test_rms_norm_is_bit_identical(shape: tuple[int, ...], scale: float) -> None:
    x = mx.random.normal(shape, key=mx.random.key(len(shape))) * scale
    weight = mx.random.normal((shape[-1],), key=mx.random.key(2))
    for eps in (1e-5, 1e-6):
        assert same(qmm.extension().rms_norm(x, weight, eps), mx.fast.rms_norm(x, weight, eps))


def test_rms_norm_reads_strided_input_and_gives_each_row_its_own_bits() -> None:
    ext = qmm.extension()
    x = mx.random.normal((64, 6), key=mx.random.key(3)).T * 5  # not row-contiguous
    weight = mx.random.normal((64,), key=mx.random.key(4))
    batch = ext.rms_norm(x, weight, 1e-5)
    assert same(batch, mx.fast.rms_norm(x, weight, 1e-5))
    for row in range(6):  # a row alone: the same bits as in the batch
        assert same(ext.rms_norm(x[row : row + 1], weight, 1e-5), batch[row : row + 1])
    special = mx.array([[0.0] * 8, [float("inf")] + [1.0] * 7, [float("nan")] * 8])
    ones = mx.ones(8)
    assert same(ext.rms_norm(special, ones, 1e-5), mx.fast.rms_norm(special, ones, 1e-5))


@pytest.mark.parametrize("traditional", [False, True])
@pytest.mark.parametrize("dims", [64, 32])
@pytest.mark.parametrize("offset", [0, 37, 100_000, "per-row"])
def test_rope_is_bit_identical(traditional: bool, dims: int, offset: int | str) -> None:
    # As attention calls it: (batch, heads, sequence, features), a transposed view.
    x = mx.random.normal((2, 5, 9, 64), key=mx.random.key(dims)).transpose(0, 2, 1, 3)
    off = mx.array([3, 4000]) if offset == "per-row" else offset
    got = qmm.extension().rope(x, dims, traditional, 10000.0, 1.0, fused_norms.offset_array(off))
    want = mx.fast.rope(x, dims, traditional=traditional, base=10000.0, scale=1.0, offset=off)
    assert same(got, want)


def test_rope_with_frequencies_a_scale_and_rank_three() -> None:
    ext = qmm.extension()
    x = mx.random.normal((2, 7, 64), key=mx.random.key(8))
    freqs = mx.random.uniform(1, 100, (32,), key=mx.random.key(9))
    offset = mx.array([1, 9])
    want = mx.fast.rope(x, 64, traditional=False, base=None, scale=1.0, offset=offset, freqs=freqs)
    assert same(ext.rope(x, 64, False, None, 1.0, offset, freqs), want)
    want = mx.fast.rope(x, 48, traditional=True, base=500.0, scale=0.25, offset=offset)
    assert same(ext.rope(x, 48, True, 500.0, 0.25, offset), want)


def test_bad_arguments_raise_value_errors() -> None:
    ext = qmm.extension()
    x = mx.zeros((1, 2, 3, 8))
    zero = mx.array(0)
    with pytest.raises(ValueError, match="float32"):
        ext.rms_norm(x.astype(mx.float16), mx.ones(8, dtype=mx.float16), 1e-5)
    with pytest.raises(ValueError, match="last size"):
        ext.rms_norm(x, mx.ones(7), 1e-5)
    with pytest.raises(ValueError, match="eps"):
        ext.rms_norm(x, mx.ones(8), 0.0)
    with pytest.raises(ValueError, match="dims"):
        ext.rope(x, 7, False, 1e4, 1.0, zero)
    with pytest.raises(ValueError, match="dims"):
        ext.rope(x, 10, False, 1e4, 1.0, zero)
    with pytest.raises(ValueError, match="rank 3 or 4"):
        ext.rope(mx.zeros((2, 8)), 8, False, 1e4, 1.0, zero)
    with pytest.raises(ValueError, match="one integer per batch row"):
        ext.rope(x, 8, False, 1e4, 1.0, mx.array([1, 2, 3]))
    with pytest.raises(ValueError, match="one integer per batch row"):
        ext.rope(x, 8, False, 1e4, 1.0, mx.array(0.5))
    with pytest.raises(ValueError, match="exactly one of base and freqs"):
        ext.rope(x, 8, False, None, 1.0, zero)
    with pytest.raises(ValueError, match="freqs must be a vector"):
        ext.rope(x, 8, False, None, 1.0, zero, mx.ones(3))


def decode(model: llama.Model, steps: int) -> list[mx.array]:
    """Prefill two rows, then greedy single-token steps: every logit on the way."""
    cache = make_prompt_cache(model)
    logits = [model(mx.array([[1, 5, 9, 33, 2], [4, 4, 8, 96, 0]]), cache=cache)]
    for _ in range(steps):
        token = mx.argmax(logits[-1][:, -1:, :], axis=-1)
        logits.append(model(token, cache=cache))
    return logits


@pytest.mark.parametrize("rope_scaling", [None, LLAMA3])
def test_the_swap_keeps_every_logit_bit_for_bit(rope_scaling: dict[str, object] | None) -> None:
    model = tiny_llama(rope_scaling=rope_scaling)
    want = decode(model, 6)
    assert fused_norms.swap_norms(model) == 2 * 2 + 1 + 2  # 2 norms a layer, final, 2 ropes
    assert fused_norms.uses_fused_norms(model)
    rope_class = fused_norms.FusedLlama3RoPE if rope_scaling else fused_norms.FusedRoPE
    assert type(model.layers[0].self_attn.rope) is rope_class
    assert all(same(g, w) for g, w in zip(decode(model, 6), want, strict=True))
    fused_norms.restore_norms(model)
    assert not fused_norms.uses_fused_norms(model)


def test_other_dtypes_fall_back_to_mlx() -> None:
    model = tiny_llama(mx.float16)
    want = decode(model, 2)
    fused_norms.swap_norms(model)  # the check runs float32 probes: swapped
    assert all(same(g, w) for g, w in zip(decode(model, 2), want, strict=True))


class Refusing(nn.RMSNorm):
    def __call__(self, x: mx.array) -> mx.array:
        raise ValueError("no")


def test_a_class_whose_check_fails_keeps_mlx_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fused class that does not give the original's bits here is swapped back, for
    every module of it; the load never fails."""
    monkeypatch.setitem(fused_norms._FUSED, nn.RMSNorm, Refusing)
    model = tiny_llama()
    assert fused_norms.swap_norms(model) == 2  # the ropes only
    assert all(type(layer.input_layernorm) is nn.RMSNorm for layer in model.layers)
