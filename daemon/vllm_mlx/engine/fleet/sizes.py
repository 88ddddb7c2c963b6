"""What a loaded model's arrays take: its parameters' bytes, and its KV cache's bytes per
token. Pure measurements of an mlx model, apart from the ModelEntry bookkeeping
(registry.py records them at load, footprint.py adds them up for the budget).

The per-token figure is an estimate from the model's shape (two tensors per layer, K
and V, of kv_heads * head_dim each).
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.models.cache import make_prompt_cache


def module_bytes(module: Any) -> int:
    """Bytes held by an mlx.nn.Module's parameters (0 for anything else)."""
    parameters = getattr(module, "parameters", None)
    if not callable(parameters):
        return 0
    return sum(int(v.nbytes) for _, v in _flat(parameters()) if isinstance(v, mx.array))


def _flat(tree: Any) -> list[tuple[str, Any]]:
    flat = tree_flatten(tree)
    assert isinstance(flat, list)  # tree_flatten returns a dict only when asked to
    return flat


def kv_shape(model: Any) -> tuple[int, int, int]:
    """(layers, kv heads, head dim) from the model's arguments; zeros when unknown."""
    args = getattr(model, "args", None)
    layers = int(getattr(args, "num_hidden_layers", 0) or 0)
    heads = int(getattr(args, "num_attention_heads", 0) or 0)
    if not layers or not heads:
        return 0, 0, 0
    kv_heads = int(getattr(args, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(args, "head_dim", None) or getattr(args, "hidden_size", 0) // heads)
    return layers, kv_heads, head_dim


def probe_kv_itemsize(model: Any) -> int:
    """The float width K and V are cached in, from one token through the model on a
    throwaway cache. The weights do not always say it: the CPU kernel computes float32
    over float16 scales, where the first floating parameter would say 2 bytes."""
    cache = make_prompt_cache(model)
    mx.eval(model(mx.array([[0]]), cache=cache))
    for layer in cache:
        keys = getattr(layer, "keys", None)
        if isinstance(keys, mx.array):
            return int(keys.dtype.size)
    return activation_itemsize(model)


def kv_bytes_per_token(
    model: Any, bits: int | None = None, group_size: int = 64, itemsize: int | None = None
) -> int:
    """K and V bytes one token takes; with `bits`, quantized: `bits` per value plus a
    scale and a bias (in the cache's float width) per `group_size` values. `itemsize`:
    that width when measured (probe_kv_itemsize), else the model's parameters'."""
    layers, kv_heads, head_dim = kv_shape(model)
    values = 2 * layers * kv_heads * head_dim
    if itemsize is None:
        itemsize = activation_itemsize(model) if values else 4
    if bits is None:
        return values * itemsize
    return values * bits // 8 + values // group_size * 2 * itemsize


def activation_itemsize(model: Any) -> int:
    """The float width the model computes in: its first floating parameter's (for a
    quantized model, the scales')."""
    for _, value in _flat(model.parameters()):
        if isinstance(value, mx.array) and mx.issubdtype(value.dtype, mx.floating):
            return int(value.dtype.size)
    return 4
