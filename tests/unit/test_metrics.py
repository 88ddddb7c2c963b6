"""metrics.py on its own registry: names, buckets, and what each event records."""

from __future__ import annotations

from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from vllm_mlx.engine.output import RequestTrace
from vllm_mlx.metrics.buckets import (
    ITL_BUCKETS,
    REQUEST_LATENCY_BUCKETS,
    TTFT_BUCKETS,
    build_1_2_5_buckets,
)
from vllm_mlx.metrics.core import Metrics
from vllm_mlx.metrics.live import MemorySample, ModelSample

MODEL = "m"
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(metrics: Metrics) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


def get(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def bucket_bounds(samples: Samples, name: str) -> list[float]:
    bounds = {
        float(dict(labels)["le"])
        for sample_name, labels in samples
        if sample_name == f"{name}_bucket"
    }
    return sorted(b for b in bounds if b != float("inf"))


def test_uses_the_injected_registry_not_the_global_one() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    assert metrics.registry is registry
    metrics.add_model(MODEL)
    assert registry.get_sample_value("vllm:prompt_tokens_total", {"model_name": MODEL}) == 0
    # Two daemons in one process (tests) never collide on metric names.
    Metrics(CollectorRegistry()).add_model(MODEL)


def test_vllm_bucket_boundaries() -> None:
    metrics = Metrics()
    metrics.add_model(MODEL)
    samples = parse(metrics)
    assert bucket_bounds(samples, "vllm:time_to_first_token_seconds") == list(TTFT_BUCKETS)
    assert bucket_bounds(samples, "vllm:inter_token_latency_seconds") == list(ITL_BUCKETS)
    for name in ("e2e_request_latency", "request_queue_time", "request_prefill_time",
                 "request_decode_time"):  # fmt: skip
        assert bucket_bounds(samples, f"vllm:{name}_seconds") == list(REQUEST_LATENCY_BUCKETS)
    assert bucket_bounds(samples, "vllm:iteration_tokens_total")[:3] == [1, 8, 16]
    assert TTFT_BUCKETS[0] == 0.001 and TTFT_BUCKETS[-1] == 2560.0
    assert build_1_2_5_buckets(100) == [1, 2, 5, 10, 20, 50, 100]


def test_a_model_reads_zero_before_its_first_request() -> None:
    metrics = Metrics()
    metrics.add_model(MODEL)
    samples = parse(metrics)
    assert get(samples, "vllm:prefix_cache_queries_total", model_name=MODEL) == 0
    assert get(samples, "vllm:prefix_cache_hits_total", model_name=MODEL) == 0
    for reason in ("stop", "length", "abort", "error"):
        labels = {"model_name": MODEL, "finished_reason": reason}
        assert get(samples, "vllm:request_success_total", **labels) == 0
    assert get(samples, "vllm_mlx_config_reloads_total", result="failure") == 0


def _trace() -> RequestTrace:
    trace = RequestTrace("r", arrived_at=100.0)
    trace.prefill_started_at = 100.5
    trace.prefill_done_at = 101.5
    return trace


def test_a_request_records_its_phases_and_tokens() -> None:
    metrics = Metrics()
    observed = metrics.request(MODEL, prompt_tokens=7)
    trace = _trace()
    observed.update(trace)
    for index, at in enumerate((102.0, 102.25, 102.5)):
        trace.first_token_at = trace.first_token_at or at
        trace.token_times.append(at)
        trace.completion_tokens = index + 1
        observed.update(trace)
    trace.finished_at = 102.5
    observed.finished(trace, "length", now=102.6)
    observed.finished(trace, "length", now=103.0)  # a second call records nothing
    samples = parse(metrics)
    m = {"model_name": MODEL}
    assert get(samples, "vllm:prompt_tokens_total", **m) == 7
    assert get(samples, "vllm:generation_tokens_total", **m) == 3
    assert get(samples, "vllm:request_queue_time_seconds_sum", **m) == 0.5
    assert get(samples, "vllm:request_prefill_time_seconds_sum", **m) == 1.0
    assert get(samples, "vllm:time_to_first_token_seconds_sum", **m) == 2.0
    assert get(samples, "vllm:inter_token_latency_seconds_count", **m) == 2
    assert get(samples, "vllm:inter_token_latency_seconds_sum", **m) == 0.5
    assert get(samples, "vllm:e2e_request_latency_seconds_sum", **m) == 2.5
    assert get(samples, "vllm:request_decode_time_seconds_sum", **m) == 1.0
    assert get(samples, "vllm:request_generation_tokens_sum", **m) == 3
    assert get(samples, "vllm:request_success_total", finished_reason="length", **m) == 1


def test_a_request_ending_on_its_first_token_still_has_a_ttft() -> None:
    metrics = Metrics()
    observed = metrics.request(MODEL, prompt_tokens=3)
    trace = _trace()
    observed.finished(trace, "stop", now=103.0)
    samples = parse(metrics)
    assert get(samples, "vllm:time_to_first_token_seconds_count", model_name=MODEL) == 1
    assert get(samples, "vllm:time_to_first_token_seconds_sum", model_name=MODEL) == 3.0


def test_tool_calls_count_as_a_stop() -> None:
    metrics = Metrics()
    metrics.request(MODEL, 1).finished(_trace(), "tool_calls", now=102.0)
    samples = parse(metrics)
    assert get(samples, "vllm:request_success_total", model_name=MODEL, finished_reason="stop") == 1


def test_aborts_count_by_reason_once() -> None:
    metrics = Metrics()
    for reason in ("timeout", "client_disconnect", "client_disconnect"):
        observed = metrics.request(MODEL, 2)
        observed.aborted(_trace(), reason)
        observed.aborted(_trace(), reason)
    samples = parse(metrics)
    m = {"model_name": MODEL}
    assert get(samples, "vllm_mlx_aborted_requests_total", reason="timeout", **m) == 1
    assert get(samples, "vllm_mlx_aborted_requests_total", reason="client_disconnect", **m) == 2
    assert get(samples, "vllm:request_success_total", finished_reason="abort", **m) == 3
    assert get(samples, "vllm:e2e_request_latency_seconds_count", **m) == 0


def test_step_hook_observes_tokens_per_step() -> None:
    metrics = Metrics()
    hook = metrics.step_hook(MODEL)
    hook(30, 0)
    hook(1, 4)
    samples = parse(metrics)
    assert get(samples, "vllm:iteration_tokens_total_count", model_name=MODEL) == 2
    assert get(samples, "vllm:iteration_tokens_total_sum", model_name=MODEL) == 35
    assert get(samples, "vllm:iteration_tokens_total_bucket", model_name=MODEL, le="8.0") == 1


def test_live_gauges_are_read_at_scrape_time() -> None:
    metrics = Metrics()
    state = {"running": 1}

    def source() -> tuple[list[ModelSample], MemorySample]:
        model = ModelSample(MODEL, "running", 2.5, state["running"], 3, 0.25)
        return [model], MemorySample(10, 20, 30, 40)

    metrics.watch(source)
    metrics.watch(source)  # a second call is ignored, not a duplicate registration
    samples = parse(metrics)
    assert get(samples, "vllm:num_requests_running", model_name=MODEL) == 1
    assert get(samples, "vllm:num_requests_waiting", model_name=MODEL) == 3
    assert get(samples, "vllm:kv_cache_usage_perc", model_name=MODEL) == 0.25
    assert get(samples, "vllm_mlx_model_load_seconds", model_name=MODEL) == 2.5
    assert get(samples, "vllm_mlx_model_state", model_name=MODEL, state="running") == 1
    assert get(samples, "vllm_mlx_model_state", model_name=MODEL, state="failed") == 0
    assert get(samples, "vllm_mlx_memory_cache_bytes") == 30
    assert get(samples, "vllm_mlx_process_resident_memory_bytes") == 40
    state["running"] = 5
    assert get(parse(metrics), "vllm:num_requests_running", model_name=MODEL) == 5


def test_http_and_refusal_counters() -> None:
    metrics = Metrics()
    metrics.http_request("/v1/models", "GET", 200, 0.01)
    metrics.http_request("/v1/models", "GET", 499, 0.5)
    metrics.config_reloaded(True)
    samples = parse(metrics)
    route = {"route": "/v1/models", "method": "GET"}
    assert get(samples, "vllm_mlx_http_requests_total", status="2xx", **route) == 1
    assert get(samples, "vllm_mlx_http_requests_total", status="4xx", **route) == 1
    assert get(samples, "vllm_mlx_http_request_duration_seconds_count", **route) == 2
    assert get(samples, "vllm_mlx_config_reloads_total", result="success") == 1
    assert get(samples, "vllm_mlx_unauthorized_requests_total", reason="missing") == 0
    assert get(samples, "vllm_mlx_rate_limited_requests_total") == 0
