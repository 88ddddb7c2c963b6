"""The kernel's opt-in int8 activations (`int8_activations`, kernels/qmm_int8.h).

x is rounded to int8 per 32 values and multiplied with AVX-512 VNNI (qmm_vnni.cpp) or
AVX2 (qmm_int8_avx2.cpp), each test once per set of tiles this CPU runs. The product is
not MLX's bit for bit, so these tests bound its error against mx.quantized_matmul, check
that it really is the int8 path (it differs from the exact one), that a row gets the same
bits alone or in a batch (what greedy decoding and seeded sampling rely on), that both
sets round alike, and that where the chosen set has no int8 tiles the flag changes
nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import mlx.core as mx
import pytest

from vllm_mlx.models.cpu import qmm

BUILT = qmm.status().available
needs_kernel = pytest.mark.skipif(not BUILT, reason=f"kernel unavailable: {qmm.status().detail}")


def int8_tile_sets() -> dict[str, str]:
    """The int8 tiles this CPU runs ("vnni", "avx2"), each with the set that takes them."""
    if not BUILT:
        return {}
    ext = qmm.extension()
    found: dict[str, str] = {}
    for isa in ("avx512", "avx2"):
        try:
            ext.set_isa(isa)
        except ValueError:
            continue
        found.setdefault(ext.int8_tiles(), isa)
    ext.set_isa("best")
    found.pop("none", None)
    return found


TILE_SETS = int8_tile_sets()
INT8 = bool(TILE_SETS)
needs_int8 = pytest.mark.skipif(not INT8, reason="this CPU has no int8 tiles (no AVX2)")
# Every test below runs once per set of int8 tiles here; none: skipped, with the reason.
each_tile_set = pytest.mark.parametrize(
    "tiles", sorted(TILE_SETS) or [pytest.param("none", marks=needs_int8)]
)
# Rounding activations to 8 bits per 32 values: ~0.55% relative error on random layers.
TOLERANCE = 1e-2


def rel_error(got: mx.array, want: mx.array) -> float:
    return float((mx.linalg.norm(got - want) / mx.linalg.norm(want)).item())


@pytest.fixture
def defaults() -> Iterator[None]:
    yield
    if BUILT:
        ext = qmm.extension()
        ext.set_isa("best")
        ext.set_parallel_min(1 << 21)
        qmm.set_threads(2)


def use(tiles: str) -> None:
    """Take `tiles` ("vnni", "avx2") for int8 products from here on."""
    ext = qmm.extension()
    ext.set_isa(TILE_SETS[tiles])
    assert ext.int8_tiles() == tiles


def quantized(n: int, k: int, bits: int, group_size: int, scale_dtype: mx.Dtype, seed: int = 1):
    w = mx.random.normal((n, k), key=mx.random.key(seed))
    wq, scales, biases = mx.quantize(w, group_size=group_size, bits=bits)
    return wq, scales.astype(scale_dtype), biases.astype(scale_dtype)


def products(x: mx.array, layer: tuple[mx.array, ...], group_size: int, bits: int):
    wq, s, b = layer
    want = mx.quantized_matmul(
        x, wq, s.astype(mx.float32), b.astype(mx.float32), True, group_size, bits
    )
    exact = qmm.extension().quantized_matmul(x, wq, s, b, group_size, bits, 1000)
    got = qmm.extension().quantized_matmul(x, wq, s, b, group_size, bits, 1000, int8=True)
    return got.astype(mx.float32), exact.astype(mx.float32), want


@each_tile_set
@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize("scale_dtype", [mx.float32, mx.float16, mx.bfloat16])
@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("bits", [4, 8])
def test_close_to_mlx_and_not_the_exact_path(
    bits: int, group_size: int, scale_dtype: mx.Dtype, n_threads: int, tiles: str, defaults: None
) -> None:
    """K not a multiple of a chunk (576 = 4.5 chunks of 128 4-bit weights; 320 at 8 bits
    is 5 chunks, 384 at 4 bits 3) reads no byte past a row; odd N and M take every tile."""
    use(tiles)
    qmm.set_threads(n_threads)
    qmm.extension().set_parallel_min(0)
    for m, n, k in [(1, 40, 576), (3, 37, 384), (6, 64, 1536), (17, 33, 320)]:
        if k % group_size:
            continue
        layer = quantized(n, k, bits, group_size, scale_dtype)
        x = mx.random.normal((m, k), key=mx.random.key(2))
        got, exact, want = products(x, layer, group_size, bits)
        assert rel_error(got, want) < TOLERANCE, (m, n, k)
        assert not mx.array_equal(got, exact).item(), "int8=True took the exact tiles"


def rounded_like_the_kernel(x: mx.array) -> mx.array:
    """x rounded as the kernel rounds it: per 32 values, to multiples of max|x| / 127."""
    blocks = x.reshape(x.shape[0], -1, 32)
    step = mx.max(mx.abs(blocks), axis=-1, keepdims=True) / 127
    return (mx.round(blocks / mx.where(step > 0, step, 1)) * step).reshape(x.shape)


@each_tile_set
@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("bits", [4, 8])
def test_the_product_is_the_rounded_activations_times_the_weights(
    bits: int, group_size: int, tiles: str, defaults: None
) -> None:
    """Exactly (to float summation order) MLX's product of the rounded activations, the
    bias term included: with x's own sums there the error was 2.7x larger (the weights'
    offsets b do not cancel the rounding errors then). The AVX2 tiles' 8-bit weights,
    multiplied as q - 128 with 128 s moved into the bias term, are exact too."""
    use(tiles)
    layer = quantized(48, 768, bits, group_size, mx.float16)
    x = mx.random.normal((3, 768), key=mx.random.key(7))
    got, _, _ = products(x, layer, group_size, bits)
    _, _, want = products(rounded_like_the_kernel(x), layer, group_size, bits)
    assert rel_error(got, want) < 1e-5


@each_tile_set
@pytest.mark.parametrize("bits", [4, 8])
def test_a_row_gets_the_same_bits_alone_or_in_a_batch(
    bits: int, tiles: str, defaults: None
) -> None:
    use(tiles)
    layer = quantized(72, 576, bits, 32, mx.float16)
    x = mx.random.normal((11, 576), key=mx.random.key(3))
    batch, _, _ = products(x, layer, 32, bits)
    for threads in (1, 2):
        qmm.set_threads(threads)
        for i in range(11):
            alone, _, _ = products(x[i : i + 1], layer, 32, bits)
            assert mx.array_equal(alone, batch[i : i + 1]).item(), (threads, i)


@each_tile_set
def test_each_block_of_32_has_its_own_scale(tiles: str, defaults: None) -> None:
    """An outlier in one block of 32 activations costs precision in that block only:
    with one scale for the row, 1e4 beside values of ~1 would round those to 0."""
    use(tiles)
    layer = quantized(16, 256, 4, 32, mx.float16)
    x = mx.random.normal((1, 256), key=mx.random.key(4))
    spiked = mx.concatenate([mx.full((1, 1), 1e4), x[:, 1:]], axis=1)
    rest = mx.concatenate([mx.zeros((1, 32)), x[:, 32:]], axis=1)
    got, _, want = products(spiked, layer, 32, 4)
    first_block = mx.concatenate([spiked[:, :32], mx.zeros((1, 224))], axis=1)
    got_first, _, _ = products(first_block, layer, 32, 4)
    got_rest, _, want_rest = products(rest, layer, 32, 4)
    # Blocks are independent: the product splits over them exactly as the parts do,
    # up to float summation order; the blocks without the spike keep int8's precision.
    assert rel_error(got, got_first + got_rest) < 1e-4
    assert rel_error(got_rest, want_rest) < TOLERANCE
    assert rel_error(got, want) < TOLERANCE


@each_tile_set
def test_zero_and_non_finite_inputs_do_not_crash(tiles: str, defaults: None) -> None:
    use(tiles)
    layer = quantized(8, 128, 4, 32, mx.float16)
    zeros, _, want = products(mx.zeros((2, 128)), layer, 32, 4)
    assert mx.array_equal(zeros, want).item() and not mx.any(want).item()  # x = 0: y = 0
    x = mx.random.normal((3, 128), key=mx.random.key(5))
    x = mx.where(mx.arange(128) == 7, mx.array(float("nan")), x)
    x = mx.where(mx.arange(128) == 70, mx.array(float("inf")), x)
    got, _, _ = products(x, layer, 32, 4)
    assert got.shape == (3, 8)  # garbage in, garbage out, but no crash or hang


@pytest.mark.skipif(
    "vnni" not in TILE_SETS or "avx2" not in TILE_SETS, reason="needs AVX-512 VNNI and AVX2"
)
@pytest.mark.parametrize("bits", [4, 8])
def test_both_sets_round_alike(bits: int, defaults: None) -> None:
    """The same int8 activations and lanes, only the float sums' order differs."""
    layer = quantized(40, 576, bits, 64, mx.bfloat16)
    x = mx.random.normal((5, 576), key=mx.random.key(8))
    got = {}
    for tiles in ("vnni", "avx2"):
        use(tiles)
        got[tiles], _, _ = products(x, layer, 64, bits)
    assert rel_error(got["avx2"], got["vnni"]) < 1e-6


@needs_kernel
def test_without_int8_tiles_the_flag_changes_nothing(defaults: None) -> None:
    """The scalar set (as on a CPU without AVX2) takes the exact tiles bit for bit."""
    ext = qmm.extension()
    ext.set_isa("scalar")
    assert not ext.int8_available() and ext.int8_tiles() == "none"
    layer = quantized(24, 256, 4, 32, mx.float16)
    x = mx.random.normal((3, 256), key=mx.random.key(6))
    got, exact, _ = products(x, layer, 32, 4)
    assert mx.array_equal(got, exact).item()


@needs_int8
def test_a_model_with_int8_activations_decodes_alike_alone_and_batched(
    model_cache_dir: Path, defaults: None
) -> None:
    """The bundled model loaded with `int8_activations: true`: its path says so, and the
    logits of a batch of prompts are each prompt's own, bit for bit."""
    from vllm_mlx.config.model import ModelSettings
    from vllm_mlx.models.loader import load_model

    settings = ModelSettings(
        name="m", source="builtin:smollm2-135m-instruct", int8_activations=True
    )
    loaded = load_model(settings, model_cache_dir)
    layers = [
        m for _, m in loaded.model.named_modules() if isinstance(m, qmm.KernelQuantizedLinear)
    ]
    assert layers and all(m.int8_activations for m in layers)
    tokens = mx.array([[1, 504, 2798, 6330, 314], [1, 9966, 28, 617, 436], [1, 29, 447, 30, 198]])
    batch = loaded.model(tokens)
    for i in range(3):
        assert mx.array_equal(loaded.model(tokens[i : i + 1]), batch[i : i + 1]).item(), i
