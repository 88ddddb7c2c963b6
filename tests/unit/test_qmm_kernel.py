"""The quantized CPU kernel against mx.quantized_matmul, and the layer swap around it."""

from __future__ import annotations

import platform
import sys
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import pytest

from tests.support.kernel import isas
from vllm_mlx.models import dtype
from vllm_mlx.models.cpu import qmm

BUILT = qmm.status().available
needs_kernel = pytest.mark.skipif(not BUILT, reason=f"kernel unavailable: {qmm.status().detail}")


def rel_error(got: mx.array, want: mx.array) -> float:
    return float((mx.linalg.norm(got - want) / mx.linalg.norm(want)).item())


@pytest.mark.skipif(sys.platform != "linux", reason="install.sh builds it on Linux")
def test_the_kernel_is_built_and_passes_its_self_check() -> None:
    """CI runs install.sh from a clean checkout: the kernel must come out of it."""
    assert qmm.status().available, qmm.status().detail
    if platform.machine() == "x86_64":
        assert qmm.status().detail.startswith(("avx2", "avx512"))


@needs_kernel
@pytest.mark.parametrize("isa", isas())
@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("bits", [4, 8])
def test_matches_mlx_on_random_shapes(
    bits: int, group_size: int, n_threads: int, isa: str, threads: None
) -> None:
    """Every instruction set the CPU has (AVX-512, AVX2, portable), threads 1 and 2."""
    qmm.set_threads(n_threads)
    ext = qmm.extension()
    ext.set_isa(isa)
    assert ext.isa() == isa
    ext.set_parallel_min(0)  # split even these small products over the threads
    key = mx.random.key(bits * 1000 + group_size)
    # Odd row counts (1..32 are decode shapes), odd output sizes (tile remainders),
    # and an output big enough to be split over threads.
    shapes = [(1, 67, 3), (3, 131, 5), (7, 517, 4), (16, 301, 3), (17, 64, 2), (32, 9, 6)]
    for rows, n_out, k_groups in shapes:
        k = k_groups * group_size
        k1, k2, key = mx.random.split(key, 3)
        w = mx.random.normal((n_out, k), key=k1)
        x = mx.random.normal((rows, k), key=k2)
        wq, scales, biases = mx.quantize(w, group_size=group_size, bits=bits)
        want = mx.quantized_matmul(x, wq, scales, biases, True, group_size, bits)
        got = ext.quantized_matmul(x, wq, scales, biases, group_size, bits)
        assert got.shape == want.shape and got.dtype == mx.float32
        assert rel_error(got, want) <= 1e-4, (rows, n_out, k)


@needs_kernel
@pytest.mark.parametrize("isa", isas())
@pytest.mark.parametrize("scale_dtype", [mx.float16, mx.bfloat16, mx.float32])
@pytest.mark.parametrize("bits", [4, 8])
def test_scales_of_each_type_reach_their_own_groups(
    bits: int, scale_dtype: mx.Dtype, isa: str, threads: None
) -> None:
    """The AVX-512 tiles convert 16 groups' scales and biases at a time (fewer past the
    row's last group): 4 groups (a short row), 40 (two windows and a tail of 8) and 20."""
    ext = qmm.extension()
    ext.set_isa(isa)
    for k, group_size in ((256, 64), (1280, 32), (1280, 64)):
        w = mx.random.normal((96, k), key=mx.random.key(k + group_size))
        wq, scales, biases = mx.quantize(w, group_size=group_size, bits=bits)
        scales, biases = scales.astype(scale_dtype), biases.astype(scale_dtype)
        for rows in (1, 5, 9):
            x = mx.random.normal((rows, k), key=mx.random.key(2))
            want = mx.quantized_matmul(x, wq, scales, biases, True, group_size, bits)
            got = ext.quantized_matmul(x, wq, scales, biases, group_size, bits)
            assert got.dtype == want.dtype and rel_error(got, want) <= 1e-4, (k, rows)


@needs_kernel
def test_instruction_sets_agree_with_each_other(threads: None) -> None:
    """The same product on every instruction set: all within float32 rounding of each other."""
    ext = qmm.extension()
    w = mx.random.normal((200, 384), key=mx.random.key(5))
    x = mx.random.normal((11, 384), key=mx.random.key(6))
    wq, scales, biases = mx.quantize(w, group_size=64, bits=4)
    results = {}
    for isa in isas():
        ext.set_isa(isa)
        results[isa] = ext.quantized_matmul(x, wq, scales, biases, 64, 4)
    assert "scalar" in results
    for isa, got in results.items():
        assert rel_error(got, results["scalar"]) <= 1e-5, isa
    with pytest.raises(ValueError, match="isa must be"):
        ext.set_isa("sse9")


@needs_kernel
@pytest.mark.parametrize("isa", isas())
@pytest.mark.parametrize("bits", [4, 8])
def test_a_row_gets_the_same_bits_alone_or_in_a_batch(bits: int, isa: str, threads: None) -> None:
    """Batch invariance: a sequence decoded alone, beside others, or re-fed after a
    prefix-cache hit must see identical logits, or seeded sampling stops reproducing."""
    ext = qmm.extension()
    ext.set_isa(isa)
    for k, group_size in ((256, 64), (1088, 32)):  # 4 groups; 34 (16-group windows, tail)
        w = mx.random.normal((37, k), key=mx.random.key(11))
        wq, scales, biases = mx.quantize(w, group_size=group_size, bits=bits)
        scales, biases = scales.astype(mx.float16), biases.astype(mx.float16)
        x = mx.random.normal((16, k), key=mx.random.key(12))
        alone = [ext.quantized_matmul(x[r : r + 1], wq, scales, biases, group_size, bits)[0]
                 for r in range(16)]  # fmt: skip
        for rows in range(2, 17):  # tiles of 8 rows and of every remainder, 1 to 7
            batch = ext.quantized_matmul(x[:rows], wq, scales, biases, group_size, bits)
            for row in range(rows):
                assert mx.array_equal(alone[row], batch[row]).item(), (k, rows, row)


@needs_kernel
@pytest.mark.parametrize("isa", isas())
@pytest.mark.parametrize("bits", [4, 8])
def test_output_rows_over_several_weight_blocks_keep_the_bits(
    bits: int, isa: str, threads: None
) -> None:
    """On one thread a call sweeps all 301 output rows: several of the multi-row tiles'
    256 KiB weight blocks at 4096 inputs, the last one odd. Each row matches itself alone."""
    ext = qmm.extension()
    ext.set_isa(isa)
    ext.set_threads(1)
    w = mx.random.normal((301, 4096), key=mx.random.key(13))
    wq, scales, biases = mx.quantize(w, group_size=64, bits=bits)
    scales, biases = scales.astype(mx.float16), biases.astype(mx.float16)
    x = mx.random.normal((13, 4096), key=mx.random.key(14))
    batch = ext.quantized_matmul(x, wq, scales, biases, 64, bits)
    for row in range(13):
        alone = ext.quantized_matmul(x[row : row + 1], wq, scales, biases, 64, bits)
        assert mx.array_equal(alone[0], batch[row]).item(), row


@needs_kernel
@pytest.mark.parametrize("isa", isas())
@pytest.mark.parametrize("bits", [4, 8])
def test_prefetching_ahead_never_changes_the_bits(bits: int, isa: str, threads: None) -> None:
    """The tiles prefetch their weights a distance ahead, past the array's end for the
    last tiles: any distance (off, a line, far past the end) gives the same product, for
    one row (decode tiles) and several, on one thread and split, int8 where granted."""
    ext = qmm.extension()
    ext.set_isa(isa)
    w = mx.random.normal((300, 320), key=mx.random.key(21))  # 8-row tiles and a tail
    wq, scales, biases = mx.quantize(w, group_size=32, bits=bits)
    x = mx.random.normal((5, 320), key=mx.random.key(22))
    int8_options = [False, True] if ext.int8_available() else [False]
    for int8 in int8_options:
        for rows in (x[:1], x):
            for parallel_min in (0, 2**40):
                ext.set_parallel_min(parallel_min)
                products = []
                for distance in (0, 64, 8192, 1 << 30):
                    ext.set_prefetch_distance(distance)
                    products.append(
                        ext.quantized_matmul(rows, wq, scales, biases, 32, bits, int8=int8)
                    )
                assert all(mx.array_equal(p, products[0]).item() for p in products[1:])
    ext.set_prefetch_distance(-5)
    assert ext.prefetch_distance() == 0


@needs_kernel
def test_a_large_product_is_split_and_many_calls_reuse_the_pool(threads: None) -> None:
    """Above the split threshold both threads take chunks; repeated calls (the pool's
    wake-ups and sleeps) keep giving the same answer."""
    ext = qmm.extension()
    qmm.set_threads(2)
    w = mx.random.normal((4096, 256), key=mx.random.key(9))
    wq, scales, biases = mx.quantize(w, group_size=32, bits=4)
    x = mx.random.normal((2, 256), key=mx.random.key(10))
    want = mx.quantized_matmul(x, wq, scales, biases, True, 32, 4)
    ext.set_parallel_min(0)
    split = [ext.quantized_matmul(x, wq, scales, biases, 32, 4) for _ in range(50)]
    ext.set_parallel_min(2**40)
    single = ext.quantized_matmul(x, wq, scales, biases, 32, 4)
    assert rel_error(single, want) <= 1e-4
    assert all(mx.array_equal(y, single).item() for y in split)


@needs_kernel
def test_batched_inputs_and_the_prefill_path() -> None:
    """Leading dimensions are kept; more rows than max_rows go to dequantize + BLAS."""
    ext = qmm.extension()
    w = mx.random.normal((80, 128), key=mx.random.key(3))
    wq, scales, biases = mx.quantize(w, group_size=32, bits=4)
    for shape in [(2, 3, 128), (1, 45, 128), (1, 140, 128)]:
        x = mx.random.normal(shape, key=mx.random.key(4))
        want = mx.quantized_matmul(x, wq, scales, biases, True, 32, 4)
        got = ext.quantized_matmul(x, wq, scales, biases, 32, 4, 32)
        assert got.shape == want.shape and rel_error(got, want) <= 1e-4


@needs_kernel
@pytest.mark.parametrize("isa", isas())
@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize("scale_dtype", [mx.float32, mx.float16, mx.bfloat16])
@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("bits", [4, 8])
def test_dequantize_is_mlx_bit_for_bit(
    bits: int, group_size: int, scale_dtype: mx.Dtype, n_threads: int, isa: str, threads: None
) -> None:
    """The prefill path's weights: the floats mx.dequantize writes, to the last bit (MLX
    computes s * q + b in the scales' type), on one thread or several, with each
    instruction set's loop (AVX-512 looks 4-bit weights up by a permute)."""
    qmm.set_threads(n_threads)
    ext = qmm.extension()
    ext.set_isa(isa)
    ext.set_parallel_min(0)
    key = mx.random.key(bits * 1000 + group_size)
    # Wide and tiny values: float16 overflow, subnormals and ties are all reached.
    w = mx.random.normal((520, 384), key=key) * mx.repeat(mx.array([1e-6, 1e-3, 1.0, 300.0]), 96)
    wq, scales, biases = mx.quantize(w, group_size=group_size, bits=bits)
    scales, biases = scales.astype(scale_dtype), biases.astype(scale_dtype)
    want = mx.dequantize(wq, scales, biases, group_size=group_size, bits=bits, dtype=mx.float32)
    got = ext.dequantize(wq, scales, biases, group_size, bits)
    assert got.dtype == mx.float32 and got.shape == want.shape
    assert mx.array_equal(got, want, equal_nan=True).item()


@needs_kernel
@pytest.mark.parametrize("scale_dtype", [mx.float32, mx.float16])
def test_the_prefill_product_is_the_dequantize_then_blas_product(scale_dtype: mx.Dtype) -> None:
    """More rows than max_rows: exactly x @ mx.dequantize(w).T, as before the threaded
    unpacking (greedy outputs do not move)."""
    ext = qmm.extension()
    w = mx.random.normal((192, 256), key=mx.random.key(8))
    wq, scales, biases = mx.quantize(w, group_size=64, bits=4)
    scales, biases = scales.astype(scale_dtype), biases.astype(scale_dtype)
    x = mx.random.normal((1, 300, 256), key=mx.random.key(9))
    dense = mx.dequantize(wq, scales, biases, group_size=64, bits=4, dtype=mx.float32)
    want = mx.matmul(x, dense.T)
    got = ext.quantized_matmul(x, wq, scales, biases, 64, 4, 128)
    assert mx.array_equal(got, want).item()


@needs_kernel
def test_strided_inputs_and_weights_are_read_as_they_lie() -> None:
    """x in any layout (the node copies a strided one) and lazy or strided weights (a
    contiguous node goes in front of those) give the row-major input's bits."""
    ext = qmm.extension()
    w = mx.random.normal((128, 80), key=mx.random.key(5)).T  # a strided view, before quantize
    wq, scales, biases = mx.quantize(w, group_size=32, bits=4)
    x = mx.random.normal((5, 3, 128), key=mx.random.key(6)).transpose(1, 0, 2)
    want = ext.quantized_matmul(mx.array(x.tolist()), wq, scales, biases, 32, 4)
    assert mx.array_equal(ext.quantized_matmul(x, wq, scales, biases, 32, 4), want).item()
    strided_w = mx.concatenate([wq, wq], axis=1)[:, : wq.shape[1]]
    mx.eval(strided_w)
    got = ext.quantized_matmul(x, strided_w, scales, biases, 32, 4)
    assert mx.array_equal(got, want).item()


@needs_kernel
def test_bad_arguments_raise_clear_errors() -> None:
    ext = qmm.extension()
    wq, scales, biases = mx.quantize(mx.zeros((8, 64)), group_size=32, bits=4)
    with pytest.raises(ValueError, match="no kernel"):
        ext.quantized_matmul(mx.zeros((1, 64)), wq, scales, biases, 32, 3)
    with pytest.raises(ValueError, match="last dimension must be 64"):
        ext.quantized_matmul(mx.zeros((1, 65)), wq, scales, biases, 32, 4)
    with pytest.raises(ValueError, match="scales and biases"):
        ext.quantized_matmul(mx.zeros((1, 64)), wq, scales[:, :1], biases, 32, 4)


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(64, 128)
        self.proj = nn.Linear(128, 96, bias=True)
        self.odd = nn.Linear(128, 64, bias=False)

    def __call__(self, tokens: mx.array) -> mx.array:
        h = self.embed(tokens)
        return mx.concatenate([self.proj(h), self.odd(h), self.embed.as_linear(h)], axis=-1)


def tiny(odd_bits: int = 4) -> Tiny:
    mx.random.seed(0)
    model = Tiny()
    nn.quantize(model, group_size=32, bits=4, class_predicate=lambda p, m: p != "odd")
    nn.quantize(model, group_size=32, bits=odd_bits, class_predicate=lambda p, m: p == "odd")
    return model


@needs_kernel
def test_swap_routes_layers_through_the_kernel_with_the_same_outputs() -> None:
    model = tiny()
    tokens = mx.array([[1, 5, 7, 30]])
    before = model(tokens)
    assert qmm.swap_layers(model) == 3 and qmm.uses_kernel(model)
    assert type(model.proj) is qmm.KernelQuantizedLinear
    assert type(model.embed) is qmm.KernelQuantizedEmbedding
    after = model(tokens)
    assert after.dtype == before.dtype and rel_error(after, before) <= 1e-4


@needs_kernel
def test_float16_exact_scales_are_compacted_and_others_kept() -> None:
    model = tiny()
    model.proj.scales = model.proj.scales.astype(mx.float16).astype(mx.float32)
    model.proj.biases = model.proj.biases.astype(mx.float16).astype(mx.float32)
    model.embed.scales = model.embed.scales + 1e-7  # not exact in float16
    qmm.swap_layers(model)
    assert model.proj.scales.dtype == mx.float16 and model.embed.scales.dtype == mx.float32


@needs_kernel
def test_layers_the_kernel_cannot_serve_are_left_to_mlx() -> None:
    model = tiny(odd_bits=2)
    assert not dtype.weight_info(model).kernel_ready
    assert qmm.swap_layers(model) == 2 and type(model.odd) is nn.QuantizedLinear


def test_a_missing_extension_is_reported_and_auto_keeps_the_float32_path(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "vllm_mlx.kernels._qmm", None)  # import fails
    monkeypatch.setattr(qmm, "FAILURE_NOTE", tmp_path / "BUILD_FAILED")
    qmm._status.cache_clear()
    try:
        missing = qmm.status()
        assert not missing.available and "not built" in missing.detail
        (tmp_path / "BUILD_FAILED").write_text("full log: x\nerror: no C++ compiler\n")
        qmm._status.cache_clear()
        assert "no C++ compiler" in qmm.status().detail
        model = tiny()
        converted, decision = dtype.apply_dtype(model, "auto", blas_optimized=True)
        assert decision.chosen == "float32" and not decision.kernel
        assert "no C++ compiler" in decision.reason and not qmm.uses_kernel(converted)
    finally:
        qmm._status.cache_clear()


@needs_kernel
def test_the_isa_variable_narrows_the_kernel_or_says_why_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """VLLM_MLX_KERNEL_ISA picks a narrower instruction set for the process; a name the
    CPU lacks or the kernel does not know leaves the kernel off, saying so."""
    ext = qmm.extension()
    try:
        monkeypatch.setenv(qmm.ISA_VARIABLE, "scalar")
        qmm._status.cache_clear()
        narrowed = qmm.status()
        assert narrowed.available and narrowed.detail.startswith("scalar") and ext.isa() == "scalar"
        monkeypatch.setenv(qmm.ISA_VARIABLE, "sse9")
        qmm._status.cache_clear()
        unknown = qmm.status()
        assert not unknown.available
        assert "VLLM_MLX_KERNEL_ISA='sse9'" in unknown.detail and "isa must be" in unknown.detail
    finally:
        monkeypatch.delenv(qmm.ISA_VARIABLE)
        qmm._status.cache_clear()
        ext.set_isa("best")
        assert qmm.status().available
