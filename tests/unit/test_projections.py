"""Sibling projections in one kernel call (quantized_matmul_many, models/cpu/projections.py):
the same bits as one call per layer, and the grouping around it."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import pytest

from tests.support.kernel import isas
from tests.support.tiny_model import tiny_llama
from vllm_mlx.models.cpu import projections, qmm

BUILT = qmm.status().available
pytestmark = pytest.mark.skipif(not BUILT, reason=f"kernel unavailable: {qmm.status().detail}")


def weight_sets(bits: int, outputs: tuple[int, ...], k: int = 256) -> list[tuple[mx.array, ...]]:
    return [
        tuple(mx.quantize(mx.random.normal((n, k), key=mx.random.key(n + i)), 64, bits))
        for i, n in enumerate(outputs)
    ]


def many(x: mx.array, sets: list[tuple[mx.array, ...]], bits: int, **kw: object) -> list[mx.array]:
    ext = qmm.extension()
    ws, scales, biases = ([s[i] for s in sets] for i in range(3))
    return ext.quantized_matmul_many(x, ws, scales, biases, 64, bits, **kw)  # type: ignore[no-any-return]


@pytest.mark.parametrize("isa", isas())
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("int8", [False, True])
@pytest.mark.parametrize("split", [False, True])
def test_each_product_has_the_bits_of_its_own_call(
    isa: str, bits: int, int8: bool, split: bool, threads: None
) -> None:
    """Whether on one thread or split over the pool in chunks that cross from one set to
    the next, every output row is computed as quantized_matmul computes it."""
    ext = qmm.extension()
    ext.set_isa(isa)
    ext.set_parallel_min(0 if split else 2**40)
    sets = weight_sets(bits, (96, 32, 36))  # 36: a set that ends inside a 4-row tile
    for rows in (1, 5, 16):
        x = mx.random.normal((rows, 256), key=mx.random.key(rows))
        got = many(x, sets, bits, int8=int8)
        for (w, s, b), product in zip(sets, got, strict=True):
            want = ext.quantized_matmul(x, w, s, b, 64, bits, int8=int8)
            assert product.shape == want.shape and mx.array_equal(product, want).item()


def test_rows_beyond_max_rows_take_the_per_set_path() -> None:
    ext = qmm.extension()
    sets = weight_sets(4, (64, 32))
    x = mx.random.normal((2, 40, 256), key=mx.random.key(3))  # 80 rows, batched shape
    got = many(x, sets, 4, max_rows=32)
    for (w, s, b), product in zip(sets, got, strict=True):
        want = ext.quantized_matmul(x, w, s, b, 64, 4, 32)
        assert product.shape == (2, 40, w.shape[0]) and mx.array_equal(product, want).item()


def test_sets_that_do_not_share_a_layout_are_refused() -> None:
    sets = weight_sets(4, (64, 32))
    x = mx.random.normal((1, 256))
    with pytest.raises(ValueError, match="one or more weight sets"):
        many(x, [], 4)
    with pytest.raises(ValueError, match="one or more weight sets"):
        qmm.extension().quantized_matmul_many(x, [sets[0][0]], [], [], 64, 4)
    with pytest.raises(ValueError, match="last dimension"):
        many(x, [sets[0], weight_sets(4, (32,), k=128)[0]], 4)
    half = (sets[1][0], sets[1][1].astype(mx.float16), sets[1][2].astype(mx.float16))
    with pytest.raises(ValueError, match="one dtype"):
        many(x, [sets[0], half], 4)


def quantized_tiny() -> nn.Module:
    model = tiny_llama()
    nn.quantize(model, group_size=32, bits=4)
    qmm.swap_layers(model)
    return model


def switch_off(model: nn.Module) -> None:
    for _, module in model.named_modules():
        group = getattr(module, "projection_group", None)
        if group is not None:
            group.active = False


@pytest.mark.parametrize("tokens", [[[7]], [[3], [9]], [list(range(1, 40))]])
def test_a_grouped_model_gives_the_same_bits(tokens: list[list[int]]) -> None:
    """Decode rows, a batch, and a prompt past max_rows (140 > 128: the BLAS path) alike."""
    model = quantized_tiny()
    assert projections.group_projections(model) == 2 * len(model.layers)
    assert projections.grouped(model) == 5 * len(model.layers)
    x = mx.array(tokens)
    grouped = model(x)
    switch_off(model)
    assert projections.grouped(model) == 0
    assert mx.array_equal(grouped, model(x)).item()


def test_a_member_fed_another_input_turns_its_group_off() -> None:
    """Cross-attention feeds k and v another input than q: each gets its own product."""
    model = quantized_tiny()
    projections.group_projections(model)
    attn = model.layers[0].self_attn
    x = mx.random.normal((1, 1, 64), key=mx.random.key(1))
    other = mx.random.normal((1, 1, 64), key=mx.random.key(2))
    q, k = attn.q_proj(x), attn.k_proj(other)
    assert not attn.q_proj.projection_group.active
    assert mx.array_equal(q, qmm._matmul(attn.q_proj, x)).item()
    assert mx.array_equal(k, qmm._matmul(attn.k_proj, other)).item()
    assert mx.array_equal(attn.v_proj(x), qmm._matmul(attn.v_proj, x)).item()
    assert projections.grouped(model) == 5 * len(model.layers) - 3


def test_layers_of_different_layouts_are_not_grouped() -> None:
    model = tiny_llama()
    nn.quantize(model, group_size=32, bits=8, class_predicate=lambda p, m: p.endswith("v_proj"))
    nn.quantize(model, group_size=32, bits=4)  # every layer not yet quantized
    qmm.swap_layers(model)
    assert model.layers[0].self_attn.v_proj.bits == 8
    assert projections.group_projections(model) == len(model.layers)  # gate/up only
    assert model.layers[0].self_attn.q_proj.projection_group is None
