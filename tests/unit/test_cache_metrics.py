"""The prefix cache collector: per-model counters and gauges, as Prometheus parses them."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from vllm_mlx.metrics.cache import CacheSample, PrefixCacheCollector


def test_counters_and_gauges_per_model() -> None:
    samples = [
        CacheSample("chat", hits=3, misses=2, evictions=5, rejected=1, entries=7, nbytes=10,
                    max_bytes=20),
        CacheSample("idle"),  # not loaded: every series at 0
    ]  # fmt: skip
    registry = CollectorRegistry()
    registry.register(PrefixCacheCollector(lambda: samples))
    text = generate_latest(registry).decode()
    values = {
        (s.name, s.labels["model_name"]): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert values[("vllm_mlx_prefix_cache_hits_total", "chat")] == 3
    assert values[("vllm_mlx_prefix_cache_misses_total", "chat")] == 2
    assert values[("vllm_mlx_prefix_cache_evictions_total", "chat")] == 5
    assert values[("vllm_mlx_prefix_cache_rejected_total", "chat")] == 1
    assert values[("vllm_mlx_prefix_cache_bytes", "chat")] == 10
    assert values[("vllm_mlx_prefix_cache_max_bytes", "chat")] == 20
    assert values[("vllm_mlx_prefix_cache_entries", "chat")] == 7
    assert values[("vllm_mlx_prefix_cache_hits_total", "idle")] == 0
    assert "# TYPE vllm_mlx_prefix_cache_hits_total counter" in text
