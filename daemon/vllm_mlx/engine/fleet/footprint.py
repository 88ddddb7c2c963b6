"""What a loaded model takes in memory, as the budget (engine/fleet/residency.py) counts
it: its weights, its KV cache now, and its prefix cache's bound. The weights and per-token
figures are measured once at load (engine/fleet/sizes.py) and kept on the ModelEntry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import mlx.core as mx

from vllm_mlx.engine.fleet.collector import settle
from vllm_mlx.engine.fleet.heap import release_free_memory

if TYPE_CHECKING:
    from vllm_mlx.config.model import ModelSettings
    from vllm_mlx.engine.fleet.registry import ModelEntry
    from vllm_mlx.engine.scheduler import SchedulerConfig


def free_memory() -> None:
    """Hand an unloaded model's memory back: drop the cycles that may still reference
    its arrays (frozen ones included: engine/fleet/collector.py), empty MLX's buffer
    cache, and trim the heap (engine/fleet/heap.py)."""
    settle()
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
    adapters = engine.adapters.nbytes if engine is not None else 0  # LoRA pairs beside it
    return Footprint(entry.weights_bytes + adapters, kv, prefix_cache_bound(entry))


def is_busy(entry: ModelEntry) -> bool:
    """Requests hold it, or its engine still has sequences (an aborted one finishing)."""
    engine = entry.engine
    working = engine is not None and engine.scheduler.num_running + engine.scheduler.num_waiting
    return entry.in_flight > 0 or bool(working)
