"""The SwiGLU activation through vllm_mlx/kernels' extension on the CPU.

mlx_lm compiles `swiglu` (silu(gate) * up), but on Linux MLX's CPU code is scalar: an
`exp` per element with a libm call per fma. At 16 rows that was ~10 ms of a ~100 ms
bundled-model decode step (docs/benchmarks.md). The extension's `swiglu` does the same
arithmetic vectorized, bit for bit (kernels/act_kernel.cpp), so logits do not change.

Only MLP classes whose `__call__` is exactly `down_proj(swiglu(gate_proj(x), up_proj(x)))`
(llama, qwen2/3, mistral-style and some 40 other mlx_lm models) are swapped, by class,
like qmm.py does; a load-time check against the original on a random input keeps
any class whose outputs are not bit-identical on MLX's path.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.models.activations import swiglu

from vllm_mlx.models.cpu import qmm
from vllm_mlx.models.cpu.probe import same_bits

# The names the plain SwiGLU MLP's __call__ uses, in order of first use: this also
# fixes the argument order (gate first).
_SHAPE = ("down_proj", "swiglu", "gate_proj", "up_proj")
_fused_classes: dict[type, type] = {}


def _fused_call(self: Any, x: mx.array) -> mx.array:
    gate, up = self.gate_proj(x), self.up_proj(x)
    if gate.dtype == mx.float32 and up.dtype == mx.float32 and gate.shape == up.shape:
        return self.down_proj(qmm.extension().swiglu(gate, up))  # type: ignore[no-any-return]
    return self.down_proj(swiglu(gate, up))  # type: ignore[no-any-return]


def _plain_swiglu_mlp(cls: type) -> bool:
    call = cls.__dict__.get("__call__")  # defined by the class itself, not inherited
    code = getattr(call, "__code__", None)
    if code is None or tuple(code.co_names) != _SHAPE:
        return False
    return getattr(call, "__globals__", {}).get("swiglu") is swiglu


def _fused_class(cls: type) -> type:
    if cls not in _fused_classes:
        _fused_classes[cls] = type(f"Fused{cls.__name__}", (cls,), {"__call__": _fused_call})
    return _fused_classes[cls]


def _same_outputs(module: Any, original: type) -> bool:
    """The swapped module against its original class on a random input, bit for bit."""
    dim = module.gate_proj.weight.shape[-1]
    if "scales" in module.gate_proj:  # packed: 32 / bits values per uint32
        dim = dim * 32 // module.gate_proj.bits
    x = mx.random.normal((3, 1, dim), key=mx.random.key(17)).astype(mx.float32)
    return same_bits(lambda: iter([(module(x), original.__call__(module, x))]))


def swap_activations(model: Any) -> int:
    """Route every plain SwiGLU MLP through the extension; returns how many were."""
    if not qmm.status().available:
        return 0
    swapped: list[tuple[Any, type]] = []
    checked: dict[type, bool] = {}
    for _, module in model.named_modules():
        cls = type(module)
        if not _plain_swiglu_mlp(cls):
            continue
        module.__class__ = _fused_class(cls)
        swapped.append((module, cls))
        if cls not in checked:
            checked[cls] = _same_outputs(module, cls)
    for module, cls in swapped:
        if not checked[cls]:
            module.__class__ = cls  # not bit-identical: keep MLX's own path
    return sum(1 for _, cls in swapped if checked[cls])


def fused_classes() -> tuple[type, ...]:
    """The swapped MLP classes (decoder.py fuses layers whose MLP is one of them)."""
    return tuple(_fused_classes.values())


def uses_fused(model: Any) -> bool:
    return any(type(m) in _fused_classes.values() for _, m in model.named_modules())
