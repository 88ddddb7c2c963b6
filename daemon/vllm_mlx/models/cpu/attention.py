"""Attention through vllm_mlx/kernels' extension on the CPU: decode in one op, and the
softmax of prefill.

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

Prefill (several query positions) keeps MLX's two BLAS products and replaces what lies
between them: MLX's fallback scales, masks (`where`) and softmaxes the (heads x queries x
keys) scores in single-threaded passes, 200-260 ms a layer for a 512-token chunk at 2k
keys here; the extension's `softmax_prefill` does the causal limit and a bool mask in one
threaded pass per row (docs/benchmarks.md).
"""

from __future__ import annotations

import sys
from typing import Any

import mlx.core as mx
from mlx_lm.models import base

from vllm_mlx.models.cpu import qmm

_ORIGINAL = base.scaled_dot_product_attention
_NAME = "scaled_dot_product_attention"
_prefill_kernel = True  # benchmarks and tests switch it to compare with MLX's fallback


def use_prefill_kernel(on: bool) -> None:
    global _prefill_kernel
    _prefill_kernel = on


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


def _prefills(queries: mx.array, keys: mx.array, values: mx.array, cache: Any, mask: Any) -> bool:
    if not (
        queries.ndim == 4
        and queries.shape[2] > 1
        and queries.dtype == mx.float32
        and keys.dtype == mx.float32
        and values.dtype == mx.float32
        and not hasattr(cache, "bits")
        and mx.default_device().type == mx.DeviceType.cpu
    ):
        return False
    if mask is None or (isinstance(mask, str) and mask == "causal"):
        return True
    return (
        isinstance(mask, mx.array)
        and mask.dtype == mx.bool_
        and mask.ndim == 4
        and mask.shape[1] == 1
        and mask.shape[2] == queries.shape[2]
        and mask.shape[3] == keys.shape[2]
        and mask.shape[0] in (1, queries.shape[0])
    )


def _prefill_attention(
    queries: mx.array, keys: mx.array, values: mx.array, scale: float, mask: Any
) -> mx.array:
    """softmax(scale * q k^T, causal / masked) v, grouped heads stacked along the rows so
    both products are one BLAS call per KV head, as MLX's fallback does."""
    batch, q_heads, rows, dim = queries.shape
    kv_heads = keys.shape[1]
    grouped = (queries * scale).reshape(batch, kv_heads, (q_heads // kv_heads) * rows, dim)
    scores = grouped @ keys.swapaxes(-1, -2)
    ext = qmm.extension()
    if isinstance(mask, mx.array):
        probs = ext.softmax_prefill(scores, rows, False, mask)
    else:
        probs = ext.softmax_prefill(scores, rows, mask is not None)
    out: mx.array = (probs @ values).reshape(batch, q_heads, rows, values.shape[-1])
    return out


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
    if hasattr(cache, "bits"):  # a quantized KV cache: K and V are (words, scales, biases)
        return _ORIGINAL(queries, keys, values, cache, scale=scale, mask=mask, sinks=sinks)
    if (
        sinks is None
        and (mask is None or isinstance(mask, mx.array))
        and _decodes(queries, keys, values, cache)
    ):
        return qmm.extension().sdpa_decode(  # type: ignore[no-any-return]
            queries, keys, values, scale, mask
        )
    if (
        sinks is None
        and _prefill_kernel
        and _prefills(queries, keys, values, cache, mask)
        and hasattr(qmm.extension(), "softmax_prefill")  # not in a build from before it
    ):
        return _prefill_attention(queries, keys, values, scale, mask)
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
