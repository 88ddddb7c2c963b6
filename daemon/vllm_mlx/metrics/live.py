"""The gauges of live state (running requests, memory, model states, a distributed
group's ranks), read from the daemon when Prometheus scrapes rather than updated as
events happen; core.py registers them."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

MODEL_STATES = ("not_loaded", "loading", "running", "unloading", "failed", "stopped")


@dataclass(frozen=True)
class ModelSample:
    """One served model's live state at scrape time."""

    name: str
    state: str  # one of MODEL_STATES
    load_seconds: float = 0.0
    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    kv_bytes: int = 0
    kv_bits: int = 0
    adapter_bytes: int = 0
    adapters_loaded: int = 0


@dataclass(frozen=True)
class MemorySample:
    active_bytes: int = 0
    peak_bytes: int = 0
    cache_bytes: int = 0
    rss_bytes: int = 0


LiveSource = Callable[[], tuple[list[ModelSample], MemorySample]]


class LiveCollector(Collector):
    """Gauges read from the running daemon when Prometheus scrapes."""

    def __init__(self, source: LiveSource) -> None:
        self._source = source

    def collect(self) -> Iterable[Metric]:
        models, memory = self._source()
        by_model: list[tuple[str, str, Callable[[ModelSample], float]]] = [
            ("vllm:num_requests_running", "Number of requests in model execution batches.",
             lambda m: m.running),
            ("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
             lambda m: m.waiting),
            ("vllm:kv_cache_usage_perc",
             "KV-cache usage: tokens held by live sequences over max_batch_size x context "
             "length. 1 means 100 percent usage.", lambda m: m.kv_usage),
            ("vllm_mlx_model_load_seconds", "Seconds the model took to load.",
             lambda m: m.load_seconds),
            ("vllm_mlx_kv_cache_bytes",
             "Bytes of KV cache the live sequences hold (tokens x bytes per token at the "
             "model's kv_cache.bits).", lambda m: m.kv_bytes),
            ("vllm_mlx_kv_cache_bits",
             "Bits per cached K/V value: kv_cache.bits, or the float width when unquantized.",
             lambda m: m.kv_bits),
            ("vllm_mlx_adapters_loaded", "LoRA adapters of the model in memory.",
             lambda m: m.adapters_loaded),
            ("vllm_mlx_adapter_bytes", "Bytes the model's loaded LoRA adapters hold.",
             lambda m: m.adapter_bytes),
        ]  # fmt: skip
        for name, doc, value in by_model:
            family = GaugeMetricFamily(name, doc, labels=["model_name"])
            for model in models:
                family.add_metric([model.name], float(value(model)))
            yield family
        states = GaugeMetricFamily(
            "vllm_mlx_model_state",
            "1 for the model's current load state, 0 for the others.",
            labels=["model_name", "state"],
        )
        for model in models:
            for state in MODEL_STATES:
                states.add_metric([model.name, state], 1.0 if model.state == state else 0.0)
        yield states
        for name, doc, number in (
            ("vllm_mlx_memory_active_bytes", "MLX memory in use (mx.get_active_memory).",
             memory.active_bytes),
            ("vllm_mlx_memory_peak_bytes", "Peak MLX memory since start (mx.get_peak_memory).",
             memory.peak_bytes),
            ("vllm_mlx_memory_cache_bytes", "MLX buffer cache (mx.get_cache_memory).",
             memory.cache_bytes),
            ("vllm_mlx_process_resident_memory_bytes", "Resident set size of the daemon.",
             memory.rss_bytes),
        ):  # fmt: skip
            yield GaugeMetricFamily(name, doc, value=float(number))


# A distributed group's ranks at scrape time: (rank, host, mean step seconds, mean
# exchange seconds per step, weight bytes) each, and whether the group is up.
GroupSource = Callable[[], tuple[list[tuple[int, str, float, float, int]], bool]]


class GroupCollector(Collector):
    def __init__(self, source: GroupSource) -> None:
        self._source = source

    def collect(self) -> Iterable[Metric]:
        ranks, up = self._source()
        yield GaugeMetricFamily(
            "vllm_mlx_distributed_up", "1 while every rank answers, 0 once the group failed.",
            value=1.0 if up else 0.0,
        )  # fmt: skip
        for index, name, doc in (
            (2, "vllm_mlx_distributed_step_seconds",
             "Mean wall time of one model step on each rank (last window of steps)."),
            (3, "vllm_mlx_distributed_sync_seconds",
             "Mean time per step in the step-sync exchange with rank 0 (last window)."),
            (4, "vllm_mlx_distributed_weight_bytes", "Parameter bytes each rank holds."),
        ):  # fmt: skip
            family = GaugeMetricFamily(name, doc, labels=["rank", "host"])
            for row in ranks:
                family.add_metric([str(row[0]), row[1]], float(row[index]))
            yield family
