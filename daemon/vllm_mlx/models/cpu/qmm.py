"""The fast quantized path on the CPU: vllm_mlx/kernels' MLX extension, when built.

MLX's CPU quantized matmul is a plain loop, so on Linux `dtype: auto` used to dequantize
models to float32 for BLAS (docs/benchmarks.md). The extension (AVX-512 or AVX2/FMA,
chosen at run time; threads over output rows) reads the packed 4- or 8-bit weights
directly, which is what bounds decoding.
`install.sh` builds it; when it is missing, does not load, or gives wrong answers on a
self-check, `status()` says why and the model stays on the path it had before.

Swapping changes only the class of each eligible layer (same parameters, same names), so
weights are not copied and mlx-lm's code calls the layers as usual. On a GPU nothing is
swapped: MLX's Metal/CUDA kernels are already fast.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import mlx.core as mx
from mlx.nn.layers.quantized import QuantizedEmbedding, QuantizedLinear

BITS = (4, 8)
GROUP_SIZES = (32, 64, 128)
# Prefill: inputs with more rows than this go to dequantize + BLAS inside the extension,
# when the BLAS is an optimized one; with the reference BLAS the kernel takes every size.
# MLX's CPU dequantize is a scalar loop, a fixed ~2.2 s per forward pass of the bundled
# model on a 2-core AMD EPYC: a 33-row pass took 2.20 s that way against 0.18 s in the
# kernel, 128 rows 2.52 s against 0.81 s, 256 rows 2.88 s against 1.97 s, and the two
# met at 512 (docs/benchmarks.md, "Prefill of a few hundred rows"). 128 keeps a 4x
# margin from that crossing for CPUs whose kernel is slower per row (AVX2); it is what
# an agent's later turn (~40 new tokens on a cached prefix) and a chunk's tail feed in.
# The extension now unpacks the weights itself (kernels/dequant.cpp: threaded, the same
# floats), which moves the crossing lower; 128 stays until it is measured again.
MAX_ROWS = 128
NO_LIMIT = 2**31 - 1
_max_rows = MAX_ROWS
KERNEL_DIR = Path(__file__).resolve().parents[2] / "kernels"
# A narrower instruction set than the CPU's best, for the whole process (avx2, scalar):
# to measure an AVX2-only CPU's path on an AVX-512 one, or to rule the wider path out
# when diagnosing a machine (docs/operations.md).
ISA_VARIABLE = "VLLM_MLX_KERNEL_ISA"
FAILURE_NOTE = KERNEL_DIR / "BUILD_FAILED"  # install.sh writes the build's error here


@dataclass(frozen=True)
class KernelStatus:
    available: bool
    detail: str  # what runs ("avx512, 2 threads") or why the kernel is not used


def status() -> KernelStatus:
    """Whether the extension can serve quantized layers in this process (cached)."""
    return _status()


@functools.cache
def _status() -> KernelStatus:
    if mx.default_device().type != mx.DeviceType.cpu:
        return KernelStatus(False, "not needed on the GPU: MLX's own kernels are fast there")
    try:
        ext = extension()
    except ImportError as exc:
        return KernelStatus(False, _why_missing(exc))
    forced = os.environ.get(ISA_VARIABLE, "").strip()
    if forced:
        try:
            ext.set_isa(forced)
        except ValueError as exc:
            return KernelStatus(False, f"{ISA_VARIABLE}={forced!r}: {exc}")
    error = _self_check(ext)
    if error:
        return KernelStatus(False, f"the built kernel failed its self-check: {error}")
    return KernelStatus(True, f"{ext.isa()}, {ext.threads()} threads")


_MODULE = "vllm_mlx.kernels._qmm"


def extension() -> ModuleType:
    """The built extension module (raises ImportError when it is not built); the fused
    norms, SwiGLU and attention kernels live in it too."""
    # sys.modules first: a decode step calls this ~300 times, and import_module's
    # machinery costs microseconds a call (a None entry still fails through it).
    module = sys.modules.get(_MODULE)
    return module if module is not None else importlib.import_module(_MODULE)


def _why_missing(exc: ImportError) -> str:
    if FAILURE_NOTE.is_file():
        note = FAILURE_NOTE.read_text(errors="replace").strip().splitlines()[-3:]
        return "the build failed at install: " + " / ".join(note)
    return f"not built ({exc}); ./install.sh builds it (needs a C++ compiler)"


def _self_check(ext: ModuleType) -> str | None:
    """A small product against MLX's: catches an ABI mismatch with a newer mlx wheel."""
    try:
        key = mx.random.key(7)
        w = mx.random.normal((40, 128), key=key)
        x = mx.random.normal((3, 128), key=mx.random.key(8))
        for bits in BITS:
            wq, scales, biases = mx.quantize(w, group_size=32, bits=bits)
            want = mx.quantized_matmul(x, wq, scales, biases, True, 32, bits)
            got = ext.quantized_matmul(x, wq, scales, biases, 32, bits)
            err = (mx.linalg.norm(got - want) / mx.linalg.norm(want)).item()
            assert isinstance(err, float)
            if not err <= 1e-4:
                return f"relative error {err:.2e} at {bits} bits"
    except Exception as exc:  # any failure means: do not use it
        return f"{type(exc).__name__}: {exc}"
    return None


def eligible(module: Any) -> bool:
    """A layer the kernel can serve: affine 4/8-bit, a supported group size, biases."""
    return (
        isinstance(module, QuantizedLinear | QuantizedEmbedding)
        and getattr(module, "mode", "affine") == "affine"
        and module.bits in BITS
        and module.group_size in GROUP_SIZES
        and "biases" in module
        and module["weight"].ndim == 2
    )


def max_rows() -> int:
    """Inputs with more rows than this take dequantize + BLAS (see MAX_ROWS)."""
    return _max_rows


def _matmul(module: Any, x: mx.array) -> mx.array:
    ext = extension()
    return ext.quantized_matmul(  # type: ignore[no-any-return]
        x,
        module["weight"],
        module["scales"],
        module["biases"],
        module.group_size,
        module.bits,
        _max_rows,
        int8=module.int8_activations,
    )


class KernelQuantizedLinear(QuantizedLinear):
    """QuantizedLinear whose product runs in the extension."""

    # The model's `int8_activations` (set per layer by swap_layers).
    int8_activations: bool = False
    # Its sibling projections of the same input (models/cpu/projections.py), if grouped.
    projection_group: Any = None

    def __call__(self, x: mx.array) -> mx.array:
        group = self.projection_group
        y = _matmul(self, x) if group is None else group.output(self, x)
        if "bias" in self:
            y = y + self["bias"]
        return y


class KernelQuantizedEmbedding(QuantizedEmbedding):
    """QuantizedEmbedding whose tied output projection runs in the extension."""

    # The lookup's dtype before scales were compacted (see `_compact`).
    lookup_dtype: mx.Dtype | None = None
    int8_activations: bool = False

    def __call__(self, x: mx.array) -> mx.array:
        y: mx.array = super().__call__(x)  # type: ignore[no-untyped-call]
        return y if self.lookup_dtype is None else y.astype(self.lookup_dtype)

    def as_linear(self, x: mx.array) -> mx.array:
        return _matmul(self, x)


def _compact(module: Any) -> None:
    """float32 scales and biases that are exact in float16 (GGUF's Q4_1/Q8_0 store them
    so) become float16: a sixth fewer bytes read per token, bit-identical products."""
    scales, biases = module["scales"], module["biases"]
    if scales.dtype != mx.float32:
        return
    half_s, half_b = scales.astype(mx.float16), biases.astype(mx.float16)
    exact = mx.array_equal(half_s.astype(mx.float32), scales) & mx.array_equal(
        half_b.astype(mx.float32), biases
    )
    if not exact.item():
        return
    mx.eval(half_s, half_b)
    module["scales"], module["biases"] = half_s, half_b
    if isinstance(module, KernelQuantizedEmbedding):
        module.lookup_dtype = mx.float32


def swap_layers(model: Any, *, blas_optimized: bool = True, int8_activations: bool = False) -> int:
    """Route every eligible layer through the kernel; returns how many were swapped.
    `int8_activations`: the layers ask for int8 activations (taken where the CPU grants
    AVX2 or AVX-512 VNNI: `int8_available()`)."""
    global _max_rows
    _max_rows = MAX_ROWS if blas_optimized else NO_LIMIT
    swapped = 0
    for _, module in model.named_modules():
        if not eligible(module):
            continue
        if isinstance(module, QuantizedLinear):
            module.__class__ = KernelQuantizedLinear
        else:
            module.__class__ = KernelQuantizedEmbedding
        if int8_activations:
            module.int8_activations = True
        _compact(module)
        swapped += 1
    return swapped


def uses_kernel(model: Any) -> bool:
    return any(
        isinstance(m, KernelQuantizedLinear | KernelQuantizedEmbedding)
        for _, m in model.named_modules()
    )


def set_threads(n: int) -> None:
    """Threads per matmul (tests and benchmarks); the default is the CPU count."""
    extension().set_threads(n)
