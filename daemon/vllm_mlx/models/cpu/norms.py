"""RMS norm and rotary embedding through vllm_mlx/kernels' extension on the CPU.

On the GPU `mx.fast.rms_norm` and `mx.fast.rope` are one kernel each; on the CPU MLX
evaluates their fallback graphs, ~11 and ~29 nodes per call. A node costs microseconds of
bookkeeping whatever its size, and a single-stream decode step of the bundled model calls
them 120 times (docs/benchmarks.md). The extension's `rms_norm` and `rope` are one node
each with MLX's own arithmetic (its CPU exp, sin and cos; its sequential sum), bit for bit.

`nn.RMSNorm`, `nn.RoPE` and mlx_lm's `Llama3RoPE` modules are swapped by class, as
swiglu.py does for the MLP; a load-time check on random inputs keeps MLX's path for
any class whose outputs are not bit-identical on this machine. Other dtypes, ranks and
devices fall through to MLX at call time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import mlx.core as mx
from mlx.nn.layers.normalization import RMSNorm
from mlx.nn.layers.positional_encoding import RoPE
from mlx_lm.models.rope_utils import Llama3RoPE

from vllm_mlx.models.cpu import qmm
from vllm_mlx.models.cpu.probe import same_bits


def offset_array(offset: int | mx.array) -> mx.array:
    return offset if isinstance(offset, mx.array) else mx.array(offset, dtype=mx.int32)


class FusedRMSNorm(RMSNorm):
    def __call__(self, x: mx.array) -> mx.array:
        weight = self["weight"]
        if x.dtype == mx.float32 and weight.dtype == mx.float32:
            return qmm.extension().rms_norm(x, weight, self.eps)  # type: ignore[no-any-return]
        return super().__call__(x)  # type: ignore[no-any-return, no-untyped-call]


class FusedRoPE(RoPE):
    def __call__(self, x: mx.array, offset: int | mx.array = 0) -> mx.array:
        if x.dtype == mx.float32 and x.ndim in (3, 4):
            ext = qmm.extension()
            return ext.rope(  # type: ignore[no-any-return]
                x, self.dims, self.traditional, self.base, self.scale, offset_array(offset)
            )
        return super().__call__(x, offset)  # type: ignore[arg-type, no-any-return]


class FusedLlama3RoPE(Llama3RoPE):  # type: ignore[misc]
    def __call__(self, x: mx.array, offset: int | mx.array = 0) -> mx.array:
        if x.dtype == mx.float32 and x.ndim in (3, 4):
            ext = qmm.extension()
            return ext.rope(  # type: ignore[no-any-return]
                x, self.dims, self.traditional, None, 1.0, offset_array(offset), self._freqs
            )
        return super().__call__(x, offset)  # type: ignore[arg-type, no-any-return]


_FUSED: dict[type, type] = {
    RMSNorm: FusedRMSNorm,
    RoPE: FusedRoPE,
    Llama3RoPE: FusedLlama3RoPE,
}


def _random(shape: tuple[int, ...], seed: int) -> mx.array:
    return mx.random.normal(shape, key=mx.random.key(seed)).astype(mx.float32) * 4


def _probes(module: Any) -> list[Callable[[Any], mx.array]]:
    """Calls that exercise a module the way models do: prefill, decode, batched offsets."""
    if isinstance(module, RMSNorm):
        x = _random((3, 5, module.weight.shape[0]), 11)
        return [lambda call: call(x)]
    width = module.dims + 2  # features past `dims` pass through
    x = _random((2, 9, 3, width), 12).transpose(0, 2, 1, 3)  # as attention transposes it
    return [
        lambda call: call(x),
        lambda call: call(x[:, :, -1:, :], offset=4093),
        lambda call: call(x[:, :, -1:, :], offset=mx.array([7, 300])),
    ]


def _same_outputs(module: Any, original: type) -> bool:
    def pairs() -> Iterator[tuple[mx.array, mx.array]]:
        for probe in _probes(module):
            yield probe(module), probe(lambda *a, **k: original.__call__(module, *a, **k))

    return same_bits(pairs)


def swap_norms(model: Any) -> int:
    """Route RMS norms and rotary embeddings through the extension; returns how many."""
    if not qmm.status().available:
        return 0
    checked: dict[type, bool] = {}
    swapped = 0
    for _, module in model.named_modules():
        original = type(module)
        fused = _FUSED.get(original)
        if fused is None:
            continue
        module.__class__ = fused
        if original not in checked:
            checked[original] = _same_outputs(module, original)
        if checked[original]:
            swapped += 1
        else:
            module.__class__ = original  # not bit-identical here: keep MLX's own path
    return swapped


def restore_norms(model: Any) -> None:
    """Back to MLX's path (benchmarks compare both in one process)."""
    originals = {fused: original for original, fused in _FUSED.items()}
    for _, module in model.named_modules():
        if type(module) in originals:
            module.__class__ = originals[type(module)]


def uses_fused_norms(model: Any) -> bool:
    fused = tuple(_FUSED.values())
    return any(isinstance(m, fused) for _, m in model.named_modules())
