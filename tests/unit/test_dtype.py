"""Weight format choice: the policy without a model, the conversion on small real layers."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import pytest

from vllm_mlx.models import dtype
from vllm_mlx.models.cpu.qmm import KernelStatus
from vllm_mlx.models.dtype import WeightInfo, decide

GIB = 2**30
SMALL = WeightInfo(quantized=True, float32_bytes=GIB // 2)


def choose(requested: dtype.DType, info: WeightInfo = SMALL, **kwargs: object) -> str:
    args: dict[str, object] = {"device": "cpu", "blas_optimized": True, "available_bytes": 8 * GIB}
    args.update(kwargs)
    return decide(requested, info, **args).chosen  # type: ignore[arg-type]


def test_auto_on_cpu_with_optimized_blas_is_float32() -> None:
    assert choose("auto") == "float32"


def test_auto_on_cpu_with_the_reference_blas_keeps_the_stored_format() -> None:
    assert choose("auto", blas_optimized=False) == "quantized"


def test_auto_on_gpu_keeps_quantized_weights() -> None:
    assert choose("auto", device="gpu") == "quantized"


def test_auto_keeps_quantized_when_float32_would_not_fit() -> None:
    big = WeightInfo(quantized=True, float32_bytes=5 * GIB)
    decision = decide("auto", big, device="cpu", blas_optimized=True, available_bytes=8 * GIB)
    assert decision.chosen == "quantized" and "exceed" in decision.reason


@pytest.mark.parametrize("requested", ["float32", "float16", "bfloat16", "quantized"])
def test_an_explicit_dtype_is_obeyed_everywhere(requested: dtype.DType) -> None:
    assert choose(requested, device="gpu", blas_optimized=False) == requested


def test_quantized_on_float_weights_keeps_them_and_says_so() -> None:
    plain = WeightInfo(quantized=False, float32_bytes=GIB)
    decision = decide("quantized", plain, device="cpu", blas_optimized=True, available_bytes=GIB)
    assert decision.chosen == "quantized" and "not quantized" in decision.reason


KERNEL = KernelStatus(True, "avx2, 2 threads")
NO_KERNEL = KernelStatus(False, "not built (no compiler)")
READY = WeightInfo(quantized=True, float32_bytes=GIB // 2, kernel_ready=True)


def test_auto_on_cpu_with_the_kernel_keeps_the_quantized_weights() -> None:
    decision = decide(
        "auto", READY, device="cpu", blas_optimized=True, available_bytes=8 * GIB, kernel=KERNEL
    )
    assert decision.chosen == "quantized" and decision.kernel
    assert decision.path == "quantized+kernel"


def test_auto_without_the_kernel_says_why_and_takes_float32() -> None:
    decision = decide(
        "auto", READY, device="cpu", blas_optimized=True, available_bytes=8 * GIB, kernel=NO_KERNEL
    )
    assert decision.chosen == "float32" and not decision.kernel
    assert "not built (no compiler)" in decision.reason


def test_auto_with_layers_the_kernel_cannot_serve_takes_float32() -> None:
    decision = decide(
        "auto", SMALL, device="cpu", blas_optimized=True, available_bytes=8 * GIB, kernel=KERNEL
    )
    assert decision.chosen == "float32" and "bits or group size" in decision.reason


def test_quantized_fallbacks_still_use_the_kernel_for_the_layers_it_fits() -> None:
    for requested, blas_optimized in (("quantized", True), ("auto", False)):
        decision = decide(
            requested,  # type: ignore[arg-type]
            SMALL,
            device="cpu",
            blas_optimized=blas_optimized,
            available_bytes=8 * GIB,
            kernel=KERNEL,
        )
        assert decision.chosen == "quantized" and decision.kernel


def test_the_gpu_never_uses_the_cpu_kernel() -> None:
    decision = decide(
        "auto", READY, device="gpu", blas_optimized=True, available_bytes=8 * GIB, kernel=KERNEL
    )
    assert decision.chosen == "quantized" and not decision.kernel


class Tiny(nn.Module):
    """An embedding, a linear with bias and a norm: the parameter kinds models have."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(32, 64)
        self.proj = nn.Linear(64, 128, bias=True)
        self.norm = nn.RMSNorm(128)

    def __call__(self, tokens: mx.array) -> mx.array:
        return self.norm(self.proj(self.embed(tokens)))


def quantized_tiny() -> tuple[Tiny, mx.array]:
    mx.random.seed(0)
    model = Tiny()
    nn.quantize(model, group_size=32, bits=4)
    tokens = mx.array([[1, 5, 7, 30]])
    return model, model(tokens)


def test_weight_info_counts_every_weight_at_four_bytes() -> None:
    model, _ = quantized_tiny()
    info = dtype.weight_info(model)
    # embedding 32x64 + linear 128x64 + bias 128 + norm 128, each as float32.
    assert info == WeightInfo(
        quantized=True, float32_bytes=(32 * 64 + 128 * 64 + 128 + 128) * 4, kernel_ready=True
    )


def test_float32_conversion_dequantizes_and_keeps_the_outputs() -> None:
    model, before = quantized_tiny()
    assert dtype.describe(model) == "quantized"
    converted = dtype.convert(model, "float32")
    assert dtype.describe(converted) == "float32"
    assert type(converted.proj) is nn.Linear and converted.proj.weight.dtype == mx.float32
    after = converted(mx.array([[1, 5, 7, 30]]))
    assert mx.allclose(before.astype(mx.float32), after, atol=1e-4).item()


def test_bfloat16_conversion_casts_every_float_parameter() -> None:
    model, _ = quantized_tiny()
    converted = dtype.convert(model, "bfloat16")
    assert dtype.describe(converted) == "bfloat16"
    assert converted.norm.weight.dtype == mx.bfloat16


def test_quantized_leaves_the_model_as_loaded() -> None:
    model, _ = quantized_tiny()
    assert dtype.convert(model, "quantized") is model and dtype.describe(model) == "quantized"


def test_apply_dtype_on_this_machine_reports_its_choice() -> None:
    model, _ = quantized_tiny()
    converted, decision = dtype.apply_dtype(model, "float16", blas_optimized=False)
    assert decision.chosen == "float16" and dtype.describe(converted) == "float16"


def test_int8_activations_apply_on_the_kernel_path_where_granted() -> None:
    kernel = dtype.DtypeDecision("auto", "quantized", "kernel", kernel=True)
    assert dtype.with_int8(kernel, False, "avx2") == kernel
    on = dtype.with_int8(kernel, True, "avx2")
    assert on.int8 and on.path == "quantized+kernel+int8"
    assert "int8 activations (avx2 tiles)" in on.reason
    off = dtype.with_int8(kernel, True, None)
    assert not off.int8 and off.path == "quantized+kernel" and "lacks AVX2" in off.reason
    floats = dtype.DtypeDecision("auto", "float32", "BLAS")
    ignored = dtype.with_int8(floats, True, "vnni")
    assert (
        not ignored.int8 and ignored.path == "float32" and "only the CPU kernel" in ignored.reason
    )
