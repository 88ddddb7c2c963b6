"""Decode attention through vllm_mlx/kernels' extension on the CPU.

On the CPU, `mx.fast.scaled_dot_product_attention` runs MLX's fallback graph: a scale
multiply, reshapes for grouped-query attention, a `where` for the mask, a softmax and two
tiny BLAS matmuls per head, ~10 graph nodes per layer. For the bundled model at batch 1
that was ~3.5 ms of a ~17 ms decode step. The extension's `sdpa_decode` computes the same
in one node and one pass over each sequence's K and V, read in place from the cache.

mlx_lm's model modules call `scaled_dot_product_attention` from `mlx_lm.models.base`
through their own module global, so swapping that global routes every attention layer of
the model's architecture; anything but the float32 one-position case (prefill, a
quantized KV cache, attention sinks, a string mask) goes to mlx_lm's original. The sums
run in another order than BLAS's, so outputs match MLX's to rounding, not bit for bit
(tests/unit/test_attention_kernel.py bounds the error; tests/engine/test_attention_model.py
checks greedy output of the bundled model).
"""

from __future__ import annotations

import sys
from typing import Any

import mlx.core as mx
from mlx_lm.models import base

from vllm_mlx.models.cpu import qmm

_ORIGINAL = base.scaled_dot_product_attention
_NAME = "scaled_dot_product_attention"


def _decodes(queries: mx.array, keys: mx.array, values: mx.array, cache: Any) -> bool:
    return (
        queries.ndim == 4
        and queries.shape[2] == 1
        and queries.dtype == mx.float32
        and keys.dtype == mx.float32
        and values.dtype == mx.float32
        and not hasattr(cache, "bits")  # a quantized KV cache has its own path
        and mx.default_device().type == mx.DeviceType.cpu
    )


def scaled_dot_product_attention(
    queries: mx.array,
    keys: mx.array,
    values: mx.array,
    cache: Any,
    scale: float,
    mask: Any,
    sinks: mx.array | None = None,
) -> mx.array:
    """mlx_lm.models.base's function, with the decode case in the extension."""
    if (
        sinks is None
        and (mask is None or isinstance(mask, mx.array))
        and _decodes(queries, keys, values, cache)
    ):
        return qmm.extension().sdpa_decode(  # type: ignore[no-any-return]
            queries, keys, values, scale, mask
        )
    return _ORIGINAL(queries, keys, values, cache, scale=scale, mask=mask, sinks=sinks)


def _model_modules(model: Any) -> list[Any]:
    names = {type(model).__module__}
    names.update(type(m).__module__ for _, m in model.named_modules())
    mods = [sys.modules.get(name) for name in sorted(names) if name.startswith("mlx_lm.")]
    return [mod for mod in mods if mod is not None]


def available() -> bool:
    """The extension is built, passed its self-check and has the op (a newer build)."""
    return qmm.status().available and hasattr(qmm.extension(), "sdpa_decode")


def swap_attention(model: Any) -> int:
    """Route the model's mlx_lm modules' attention through the extension (idempotent);
    returns how many modules use it."""
    if not available():
        return 0
    swapped = 0
    for mod in _model_modules(model):
        current = getattr(mod, _NAME, None)
        if current is _ORIGINAL:
            setattr(mod, _NAME, scaled_dot_product_attention)
            current = scaled_dot_product_attention
        swapped += current is scaled_dot_product_attention
    return swapped


def restore_attention(model: Any) -> int:
    """Undo swap_attention for the model's modules (tests, benchmarks); returns how many."""
    restored = 0
    for mod in _model_modules(model):
        if getattr(mod, _NAME, None) is scaled_dot_product_attention:
            setattr(mod, _NAME, _ORIGINAL)
            restored += 1
    return restored


def uses_kernel(model: Any) -> bool:
    return any(
        getattr(mod, _NAME, None) is scaled_dot_product_attention for mod in _model_modules(model)
    )
