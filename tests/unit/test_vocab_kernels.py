"""The extension's whole-vocabulary kernels (kernels/logsumexp.h): logsumexp, the same
bits as mx.logsumexp, and the categorical draw the samplers use.

The engine normalizes every sampled row with it (models/cpu/logsumexp.py), so tokens,
logprobs and seeded samples must not change: equality here is bit for bit, over the shapes
and values logits take (a large vocabulary, a few rows, masked -inf entries, a row that is
all -inf, +inf), and the fallback for what the kernel does not take.
"""

from __future__ import annotations

import platform

import mlx.core as mx
import numpy as np
import pytest

from vllm_mlx.models.cpu import qmm
from vllm_mlx.models.cpu.vocab import categorical, log_probabilities

X86 = platform.machine() in ("x86_64", "AMD64")
needs_kernel = pytest.mark.skipif(
    not (X86 and qmm.status().available), reason="the x86-64 CPU kernel is not built"
)


def reference(x: mx.array) -> mx.array:
    return mx.logsumexp(x, axis=-1, keepdims=True)


@needs_kernel
@pytest.mark.parametrize("rows", [1, 3, 16])
@pytest.mark.parametrize("vocab", [1, 7, 100, 49152, 151936])
@pytest.mark.parametrize("scale", [0.1, 1.0, 30.0])
def test_bit_identical_to_mlx(rows: int, vocab: int, scale: float) -> None:
    x = mx.random.normal((rows, vocab), key=mx.random.key(rows * vocab)) * scale
    assert mx.array_equal(qmm.extension().logsumexp(x), reference(x)).item()


@needs_kernel
def test_masked_and_infinite_rows() -> None:
    x = mx.random.normal((4, 1000), key=mx.random.key(3)) * 5
    masked = mx.where(mx.random.uniform(shape=x.shape, key=mx.random.key(4)) < 0.9, -mx.inf, x)
    rows = mx.concatenate(
        [
            masked,
            mx.full((1, 1000), -mx.inf),  # a grammar that allows nothing
            mx.concatenate([mx.zeros((1, 999)), mx.full((1, 1), mx.inf)], axis=1),
        ]
    )
    got, want = qmm.extension().logsumexp(rows), reference(rows)
    assert mx.array_equal(got, want, equal_nan=True).item()
    assert got[4, 0].item() == -float("inf") and got[5, 0].item() == float("inf")


@needs_kernel
def test_batched_leading_axes_and_strided_inputs() -> None:
    x = mx.random.normal((2, 3, 500), key=mx.random.key(5))
    assert mx.array_equal(qmm.extension().logsumexp(x), reference(x)).item()
    strided = mx.random.normal((500, 4), key=mx.random.key(6)).T  # a transposed view
    assert mx.array_equal(qmm.extension().logsumexp(strided), reference(strided)).item()


@needs_kernel
def test_bad_input_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="float32"):
        qmm.extension().logsumexp(mx.zeros((2, 3), dtype=mx.float16))


def test_log_probabilities_are_mlx_s_for_every_dtype() -> None:
    for dtype in (mx.float32, mx.float16, mx.bfloat16):
        x = (mx.random.normal((3, 2000), key=mx.random.key(7)) * 4).astype(dtype)
        assert mx.array_equal(log_probabilities(x), x - reference(x)).item(), dtype


@needs_kernel
def test_categorical_draws_follow_the_softmax() -> None:
    """20,000 draws of a 6-token row (one masked): a chi-square test of the frequencies
    against softmax(logits); fixed keys, so the test is deterministic (p > 1e-3 here)."""
    logits = mx.array([[0.0, 1.0, 2.0, -mx.inf, 0.5, -1.0]])
    draws = 20_000
    rows = mx.broadcast_to(logits, (draws, 6))
    tokens = categorical(rows, mx.random.key(11))
    assert tokens.shape == (draws,) and tokens.dtype == mx.uint32
    counts = np.bincount(np.array(tokens), minlength=6)
    assert counts[3] == 0  # a masked token is never drawn
    p = np.array(mx.softmax(logits, axis=-1)[0])
    keep = p > 0
    chi2 = float((((counts - draws * p) ** 2)[keep] / (draws * p)[keep]).sum())
    assert chi2 < 20.5  # the 0.999 quantile of chi-square with 4 degrees of freedom: 18.5


@needs_kernel
def test_categorical_is_seeded_and_shaped_like_mlx_s() -> None:
    x = mx.random.normal((3, 49152), key=mx.random.key(12))
    first = categorical(x, mx.random.key(5))
    assert mx.array_equal(first, categorical(x, mx.random.key(5))).item()
    assert first.shape == mx.random.categorical(x, key=mx.random.key(5)).shape
    one = categorical(x[:1], mx.random.key(6))
    assert one.shape == (1,) and 0 <= one.item() < 49152


@needs_kernel
def test_categorical_edge_rows() -> None:
    ext = qmm.extension()
    nothing = ext.categorical_draw(mx.full((1, 4), -mx.inf), mx.array([0.5]))
    assert nothing.tolist() == [0]  # a grammar that allows nothing: a valid index, no fault
    assert ext.categorical_draw(mx.array([[0.0, mx.inf, 1.0]]), mx.array([0.9])).tolist() == [1]
    assert ext.categorical_draw(mx.array([[3.0, -mx.inf]]), mx.array([0.999999])).tolist() == [0]
    with pytest.raises(ValueError, match="one float32 uniform per row"):
        ext.categorical_draw(mx.zeros((2, 3)), mx.zeros((3,)))
