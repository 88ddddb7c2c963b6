"""Metrics of the models' residency: loads, unloads, evictions, load time, memory.

Beside core.py (the request and engine metrics) on the same injected registry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

# From a small model on a fast disk (~1 s) to a large one read from a slow disk.
LOAD_BUCKETS = (0.25, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500)
UNLOAD_REASONS = ("idle", "evicted", "explicit")

# (model name, bytes it holds now) for every configured model; the budget (None: none).
MemorySource = Callable[[], tuple[list[tuple[str, int]], int | None]]


class _MemoryCollector(Collector):
    def __init__(self, source: MemorySource) -> None:
        self._source = source

    def collect(self) -> Iterable[Metric]:
        models, budget = self._source()
        family = GaugeMetricFamily(
            "vllm_mlx_model_memory_bytes",
            "Memory a model holds against the budget: weights, KV cache in use and its "
            "prefix cache's bound; 0 when not loaded.",
            labels=["model_name"],
        )
        for name, size in models:
            family.add_metric([name], float(size))
        yield family
        yield GaugeMetricFamily(
            "vllm_mlx_model_memory_budget_bytes",
            "memory.budget_* in bytes; -1 when no budget is set.",
            value=float(-1 if budget is None else budget),
        )


class ModelMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.loads = Counter(
            "vllm_mlx_model_loads",
            "Model loads, by outcome (ok, failed).",
            ["model_name", "outcome"],
            registry=registry,
        )
        self.unloads = Counter(
            "vllm_mlx_model_unloads",
            "Models unloaded, by reason (idle: keep_alive passed; evicted: room for "
            "another under the budget; explicit: POST /v1/models/{id}/unload).",
            ["model_name", "reason"],
            registry=registry,
        )
        self.evictions = Counter(
            "vllm_mlx_model_evictions",
            "Models unloaded to make room for another under memory.budget_*.",
            ["model_name"],
            registry=registry,
        )
        self.load_duration = Histogram(
            "vllm_mlx_model_load_duration_seconds",
            "Seconds from the start of a load to the model serving.",
            ["model_name"],
            registry=registry,
            buckets=LOAD_BUCKETS,
        )
        self._memory: _MemoryCollector | None = None

    def add_model(self, name: str) -> None:
        """Series that read 0 before the first event."""
        for outcome in ("ok", "failed"):
            self.loads.labels(name, outcome)
        for reason in UNLOAD_REASONS:
            self.unloads.labels(name, reason)
        self.evictions.labels(name)
        self.load_duration.labels(name)

    def watch(self, source: MemorySource) -> None:
        if self._memory is None:
            self._memory = _MemoryCollector(source)
            self.registry.register(self._memory)

    def loaded(self, name: str, seconds: float, ok: bool) -> None:
        self.loads.labels(name, "ok" if ok else "failed").inc()
        if ok:
            self.load_duration.labels(name).observe(seconds)

    def unloaded(self, name: str, reason: str) -> None:
        self.unloads.labels(name, reason).inc()
        if reason == "evicted":
            self.evictions.labels(name).inc()
