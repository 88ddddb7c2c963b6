"""What a loaded model takes in memory: its weights, the KV cache per token, and what
the budget (engine/residency.py) counts for it.

The per-token figure is an estimate from the model's shape (two tensors per layer, K
and V, of kv_heads * head_dim each).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import mlx.core as mx
from mlx.utils import tree_flatten

if TYPE_CHECKING:
    from vllm_mlx.config.model import ModelSettings
    from vllm_mlx.engine.fleet.registry import ModelEntry
    from vllm_mlx.engine.scheduler import SchedulerConfig


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


def kv_bytes_per_token(model: Any) -> int:
    args = getattr(model, "args", None)
    layers = int(getattr(args, "num_hidden_layers", 0) or 0)
    heads = int(getattr(args, "num_attention_heads", 0) or 0)
    if not layers or not heads:
        return 0
    kv_heads = int(getattr(args, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(args, "head_dim", None) or getattr(args, "hidden_size", 0) // heads)
    return 2 * layers * kv_heads * head_dim * _activation_itemsize(model)


def _activation_itemsize(model: Any) -> int:
    """The float width the model computes in: its first floating parameter's (for a
    quantized model, the scales')."""
    for _, value in _flat(model.parameters()):
        if isinstance(value, mx.array) and mx.issubdtype(value.dtype, mx.floating):
            return int(value.dtype.size)
    return 4


def free_memory() -> None:
    """Hand an unloaded model's memory back: drop the cycles that may still reference
    its arrays, empty MLX's buffer cache, and trim the heap (engine/heap.py)."""
    import gc

    from vllm_mlx.engine.fleet.heap import release_free_memory

    gc.collect()
    mx.clear_cache()
    release_free_memory()


@dataclass(frozen=True)
class Footprint:
    weights: int
    kv: int
    prefix_cache_bound: int

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.prefix_cache_bound


def prefix_cache_bound(entry: ModelEntry) -> int:
    """The most its prefix cache may hold: counted whole, as the cache may fill to it."""
    engine = entry.engine
    return int(engine.scheduler.prefix_cache.max_bytes) if engine is not None else 0


def planned_prefix_cache_bound(model: ModelSettings, config: SchedulerConfig) -> int:
    """The same bound for a model not loaded yet, from the config it will start with."""
    return config.prefix_cache_bytes if model.task == "generate" else 0


def footprint(entry: ModelEntry) -> Footprint:
    if entry.runner is None:
        return Footprint(0, 0, 0)
    engine = entry.engine
    kv = engine.scheduler.kv_tokens * entry.kv_token_bytes if engine is not None else 0
    return Footprint(entry.weights_bytes, kv, prefix_cache_bound(entry))


def is_busy(entry: ModelEntry) -> bool:
    """Requests hold it, or its engine still has sequences (an aborted one finishing)."""
    engine = entry.engine
    working = engine is not None and engine.scheduler.num_running + engine.scheduler.num_waiting
    return entry.in_flight > 0 or bool(working)
