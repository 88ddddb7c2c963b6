"""The extension's SwiGLU against mlx_lm's (bit for bit), and the MLP swap around it."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx_lm.models import llama
from mlx_lm.models.activations import swiglu

from tests.support.tiny_model import tiny_llama
from vllm_mlx.models.cpu import qmm
from vllm_mlx.models.cpu import swiglu as fused

BUILT = qmm.status().available
pytestmark = pytest.mark.skipif(not BUILT, reason=f"kernel unavailable: {qmm.status().detail}")


def same_bits(got: mx.array, want: mx.array) -> bool:
    a, b = np.array(got), np.array(want)
    return bool(((a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))).all())


def special_values() -> mx.array:
    edges = [0.0, -0.0, 88.0, -88.0, 88.1, -88.1, 1e30, -1e30, 1e-40, -1e-40]
    edges += [float("inf"), float("-inf"), float("nan")]
    # Where x * log2(e) lands on k + 0.5: floor(x + 0.5) must round the tie up.
    ties = [(k + 0.5) / 1.442695 for k in range(-130, 130)]
    return mx.array(edges + ties, dtype=mx.float32)


@pytest.mark.parametrize("n", [1, 7, 15, 16, 17, 33, 1539])
def test_swiglu_is_bit_identical_to_mlx_lm_at_every_length(isa: str, n: int) -> None:
    """Vector bodies and tails (masked or copied) give every element MLX's arithmetic."""
    key = mx.random.key(n)
    gate = mx.random.normal((3, 1, n), key=key) * 8
    up = mx.random.normal((3, 1, n), key=mx.random.key(n + 1))
    assert same_bits(qmm.extension().swiglu(gate, up), swiglu(gate, up))


def test_swiglu_matches_on_edges_ties_and_a_dense_sweep(isa: str) -> None:
    ext = qmm.extension()
    special = special_values()
    ones = mx.ones_like(special)
    assert same_bits(ext.swiglu(special, ones), swiglu(special, ones))
    sweep = mx.array(np.linspace(-100, 100, 400_001, dtype=np.float32))
    up = mx.full(sweep.shape, 1.5)
    assert same_bits(ext.swiglu(sweep, up), swiglu(sweep, up))


def test_swiglu_takes_strided_inputs_and_refuses_other_dtypes() -> None:
    ext = qmm.extension()
    gate = mx.random.normal((64, 48), key=mx.random.key(3)).T  # not row-contiguous
    up = mx.random.normal((48, 64), key=mx.random.key(4))
    assert same_bits(ext.swiglu(gate, up), swiglu(gate, up))
    with pytest.raises(ValueError, match="float32"):
        ext.swiglu(gate.astype(mx.float16), up.astype(mx.float16))
    with pytest.raises(ValueError, match="one shape"):
        ext.swiglu(gate, up[:1])


@pytest.mark.parametrize("quantized", [False, True])
def test_the_swap_keeps_the_logits_bit_for_bit(quantized: bool) -> None:
    model = tiny_llama()
    if quantized:
        nn.quantize(model, group_size=32, bits=4)
        qmm.swap_layers(model)
    tokens = mx.array([[1, 5, 9, 33, 2], [4, 4, 8, 96, 0]])
    want = model(tokens)
    assert fused.swap_activations(model) == 2
    assert fused.uses_fused(model)
    assert all(type(layer.mlp).__name__ == "FusedMLP" for layer in model.layers)
    assert same_bits(model(tokens), want)


def test_other_dtypes_fall_back_to_mlx() -> None:
    model = tiny_llama(mx.float16)
    tokens = mx.array([[1, 5, 9]])
    want = model(tokens)
    fused.swap_activations(model)  # the check runs float32 activations: swapped
    assert mx.array_equal(model(tokens), want).item()  # float16 ones take mlx_lm's swiglu


class GeluMLP(llama.MLP):
    """Another activation: its own __call__, which the swap must leave alone."""

    def __call__(self, x: mx.array) -> mx.array:
        return self.down_proj(nn.gelu(self.gate_proj(x)) * self.up_proj(x))  # type: ignore[no-any-return]


def test_only_the_plain_swiglu_mlp_is_swapped() -> None:
    model = tiny_llama()
    model.layers[0].mlp.__class__ = GeluMLP
    assert fused.swap_activations(model) == 1
    assert type(model.layers[0].mlp) is GeluMLP
    assert type(model.layers[1].mlp).__name__ == "FusedMLP"


class Refusing(nn.Linear):
    def __call__(self, x: mx.array) -> mx.array:
        raise ValueError("no")


def test_a_module_the_check_cannot_run_keeps_its_class() -> None:
    """The load-time check never fails a load: the class (checked once, on its first
    module) stays on mlx_lm's path, for every module of it."""
    model = tiny_llama()
    for layer in model.layers:
        layer.mlp.gate_proj.__class__ = Refusing
    assert fused.swap_activations(model) == 0
    assert all(type(layer.mlp) is llama.MLP for layer in model.layers)
