"""Weight format per model and backend: `dtype: auto|float32|float16|bfloat16|quantized`.

Why `auto` differs by backend (measured, see docs/benchmarks.md):
- Metal (and CUDA): quantized matmuls are native kernels and decoding is bound by
  memory bandwidth, so fewer bytes per weight is faster. Keep what was stored.
- CPU: MLX's quantized matmul is a plain loop that gains nothing from batching, while
  a float32 matmul goes to BLAS. With an optimized BLAS (see vllm_mlx.models.cpu.blas) float32
  weights decode several times faster and scale with the batch; float16/bfloat16 have
  no BLAS path on the CPU and are slower still. So `auto` dequantizes to float32 on
  the CPU when an optimized BLAS is in use and the float32 weights fit comfortably in
  memory; otherwise it keeps the stored (smaller) format.
- CPU with vllm-mlx's quantized kernel (models/cpu/qmm.py, built by install.sh): the stored
  4/8-bit weights are read directly with AVX2 and threads, faster than float32 + BLAS at
  a quarter of the memory, so `auto` keeps them when every quantized layer fits it.

Only the loader calls `apply_dtype`, on the thread that loads the model, before the
engine thread owns it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

import mlx.core as mx

if TYPE_CHECKING:
    from vllm_mlx.models.cpu.qmm import KernelStatus

DType = Literal["auto", "float32", "float16", "bfloat16", "quantized"]
DTYPES: tuple[DType, ...] = ("auto", "float32", "float16", "bfloat16", "quantized")

# float32 weights may use at most this share of the memory available at load time:
# the KV cache, activations and the rest of the system need the remainder.
MEMORY_SHARE = 0.5

_MX_DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}


@dataclass(frozen=True)
class WeightInfo:
    """What the loaded weights are, before any conversion."""

    quantized: bool
    float32_bytes: int  # the size of every weight as float32
    kernel_ready: bool = False  # every quantized layer fits the CPU kernel (models/cpu/qmm.py)


@dataclass(frozen=True)
class DtypeDecision:
    requested: DType
    chosen: str  # "quantized" (kept as stored) or a float dtype name
    reason: str
    kernel: bool = False  # quantized layers run in vllm-mlx's CPU kernel
    int8: bool = False  # ... with int8 activations (`int8_activations`)

    @property
    def path(self) -> str:
        """What computes: `quantized+kernel[+int8]`, `quantized` (MLX's own) or a float dtype."""
        if self.kernel:
            return "quantized+kernel+int8" if self.int8 else "quantized+kernel"
        return self.chosen


def with_int8(decision: DtypeDecision, requested: bool, tiles: str | None) -> DtypeDecision:
    """The decision with `int8_activations` applied, or the reason it is not; `tiles`: the
    int8 tiles the kernel takes here ("vnni", "avx2"), None where it has none."""
    if not requested:
        return decision
    if decision.kernel and tiles:
        reason = f"{decision.reason}; int8 activations ({tiles} tiles)"
        return replace(decision, int8=True, reason=reason)
    why = "the CPU lacks AVX2" if decision.kernel else "only the CPU kernel has them"
    return replace(decision, reason=f"{decision.reason}; int8_activations ignored: {why}")


def int8_tiles() -> str | None:
    """The int8 tiles the built kernel takes on this CPU ("vnni", "avx2"), or None."""
    from vllm_mlx.models.cpu import qmm

    if not qmm.status().available or not qmm.extension().int8_available():
        return None
    return str(qmm.extension().int8_tiles())


def backend() -> str:
    """`cpu`, `gpu` (Metal or CUDA): the device mlx computes on by default."""
    return "cpu" if mx.default_device().type == mx.DeviceType.cpu else "gpu"


def weight_info(model: Any) -> WeightInfo:
    from vllm_mlx.models.cpu.qmm import eligible

    quantized = [m for _, m in model.named_modules() if "scales" in m]
    bits_of = {name: int(m.bits) for name, m in model.named_modules() if "scales" in m}
    elements = 0
    for name, value in _flat_parameters(model):
        prefix, _, leaf = name.rpartition(".")
        if prefix in bits_of:
            # Packed uint32 words hold 32/bits weights; scales and biases vanish.
            if leaf == "weight":
                elements += value.size * 32 // bits_of[prefix]
            elif leaf not in ("scales", "biases"):
                elements += value.size
        elif mx.issubdtype(value.dtype, mx.floating):
            elements += value.size
    ready = bool(quantized) and all(eligible(m) for m in quantized)
    return WeightInfo(bool(bits_of), elements * 4, ready)


def _flat_parameters(model: Any) -> list[tuple[str, mx.array]]:
    from mlx.utils import tree_flatten

    flat = tree_flatten(model.parameters())
    assert isinstance(flat, list)  # tree_flatten returns a dict only when asked to
    return flat


def decide(
    requested: DType,
    info: WeightInfo,
    *,
    device: str,
    blas_optimized: bool,
    available_bytes: int,
    kernel: KernelStatus | None = None,
) -> DtypeDecision:
    """Pure policy: which format to serve in (unit-tested without a model)."""
    use_kernel = device == "cpu" and info.quantized and kernel is not None and kernel.available
    if requested != "auto":
        if requested == "quantized" and not info.quantized:
            return DtypeDecision(requested, "quantized", "the weights are not quantized: kept")
        if requested == "quantized" and use_kernel:
            return DtypeDecision(requested, requested, "set in the config", kernel=True)
        return DtypeDecision(requested, requested, "set in the config")
    if device != "cpu":
        return DtypeDecision(requested, "quantized", "GPU: keep the stored format")
    if use_kernel and info.kernel_ready:
        return DtypeDecision(
            requested,
            "quantized",
            "CPU with the quantized kernel: reads the stored weights",
            kernel=True,
        )
    decision = _without_kernel(requested, info, blas_optimized, available_bytes)
    if decision.chosen == "quantized" and use_kernel:
        return replace(decision, kernel=True)  # the layers it fits still gain
    if info.quantized and kernel is not None:
        why = kernel.detail if not kernel.available else "a layer's bits or group size"
        return replace(decision, reason=f"{decision.reason} (quantized CPU kernel unused: {why})")
    return decision


def _without_kernel(
    requested: DType, info: WeightInfo, blas_optimized: bool, available_bytes: int
) -> DtypeDecision:
    if not blas_optimized:
        return DtypeDecision(
            requested, "quantized", "CPU without an optimized BLAS: keep the stored format"
        )
    budget = int(available_bytes * MEMORY_SHARE)
    if info.float32_bytes > budget:
        return DtypeDecision(
            requested,
            "quantized",
            f"float32 weights ({info.float32_bytes >> 20} MiB) exceed {MEMORY_SHARE:.0%} "
            f"of available memory ({available_bytes >> 20} MiB)",
        )
    return DtypeDecision(requested, "float32", "CPU with an optimized BLAS: float32 is faster")


def convert(model: Any, chosen: str) -> Any:
    """Dequantize and cast in place; `quantized` leaves the model as loaded."""
    if chosen == "quantized":
        return model
    from mlx_lm.utils import dequantize_model

    model = dequantize_model(model)
    model.set_dtype(_MX_DTYPES[chosen])
    mx.eval(model.parameters())
    return model


def apply_dtype(
    model: Any, requested: DType, *, blas_optimized: bool, int8_activations: bool = False
) -> tuple[Any, DtypeDecision]:
    import psutil

    from vllm_mlx.models.cpu import attention, decoder, projections, qmm
    from vllm_mlx.models.cpu import norms as fused_norms
    from vllm_mlx.models.cpu import swiglu as fused

    device = backend()
    decision = decide(
        requested,
        weight_info(model),
        device=device,
        blas_optimized=blas_optimized,
        available_bytes=psutil.virtual_memory().available,
        kernel=qmm.status() if device == "cpu" else None,
    )
    decision = with_int8(decision, int8_activations, int8_tiles() if decision.kernel else None)
    model = convert(model, decision.chosen)
    if decision.kernel:
        qmm.swap_layers(model, blas_optimized=blas_optimized, int8_activations=decision.int8)
        projections.group_projections(model)  # q/k/v and gate/up: one call each
    if device == "cpu":  # float32 activations on either path: the extension's fused ops
        fused.swap_activations(model)
        fused_norms.swap_norms(model)
        attention.swap_attention(model)  # decode attention in one node (models/cpu/attention.py)
    if decision.kernel:  # a decode step's layer in two nodes around the cache and attention
        decoder.swap_decoder_layers(model)
    return model, decision


def describe(model: Any) -> str:
    """The dtype a loaded model computes in, for logs: `quantized` or a float name."""
    for _, module in model.named_modules():
        if "scales" in module:
            return "quantized"
    for _, value in _flat_parameters(model):
        if mx.issubdtype(value.dtype, mx.floating):
            return str(value.dtype).removeprefix("mlx.core.")
    return "unknown"
