"""Prefix cache metrics per model, read from each engine's cache when Prometheus scrapes.

The engine thread already counts hits, misses, evictions and refusals in plain ints
(engine/cache/prefix.py); reading them at scrape time keeps every cache operation free of
metrics calls. A counter starts again from 0 when its model is reloaded (a new engine
and cache), which Prometheus' rate() and increase() treat as a counter reset.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector


@dataclass(frozen=True)
class CacheSample:
    """One generation model's prefix cache (all 0 while the model is not loaded)."""

    model: str
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    rejected: int = 0
    entries: int = 0
    nbytes: int = 0
    max_bytes: int = 0


CacheSource = Callable[[], list[CacheSample]]

COUNTERS: tuple[tuple[str, str, Callable[[CacheSample], int]], ...] = (
    ("vllm_mlx_prefix_cache_hits", "Requests that reused a cached prompt prefix.",
     lambda s: s.hits),
    ("vllm_mlx_prefix_cache_misses", "Requests looked up that found no cached prefix.",
     lambda s: s.misses),
    ("vllm_mlx_prefix_cache_evictions",
     "Entries evicted to make room (whole prompts, or 16-token blocks when paged).",
     lambda s: s.evictions),
    ("vllm_mlx_prefix_cache_rejected",
     "Stores refused: larger than the whole bound, or a cache that cannot be paged.",
     lambda s: s.rejected),
)  # fmt: skip
GAUGES: tuple[tuple[str, str, Callable[[CacheSample], int]], ...] = (
    ("vllm_mlx_prefix_cache_bytes", "Bytes of KV arrays the prefix cache holds.",
     lambda s: s.nbytes),
    ("vllm_mlx_prefix_cache_max_bytes", "The prefix cache's bound (engine.cache_memory_mb).",
     lambda s: s.max_bytes),
    ("vllm_mlx_prefix_cache_entries", "Entries held: whole prompts, or blocks when paged.",
     lambda s: s.entries),
)  # fmt: skip


class PrefixCacheCollector(Collector):
    def __init__(self, source: CacheSource) -> None:
        self._source = source

    def collect(self) -> Iterable[Metric]:
        samples = self._source()
        for name, doc, value in COUNTERS:
            counter = CounterMetricFamily(name, doc, labels=["model_name"])
            for sample in samples:
                counter.add_metric([sample.model], float(value(sample)))
            yield counter
        for name, doc, value in GAUGES:
            gauge = GaugeMetricFamily(name, doc, labels=["model_name"])
            for sample in samples:
                gauge.add_metric([sample.model], float(value(sample)))
            yield gauge
