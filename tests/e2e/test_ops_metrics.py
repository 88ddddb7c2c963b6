"""/metrics against a real daemon: parsed with prometheus-client, checked to move with requests."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.conftest import DaemonProcess, running
from tests.e2e.ops_support import (
    MODEL,
    NO_EOS,
    Samples,
    chat_body,
    scrape,
    value,
    wait_for,
)

ENGINE_COUNTERS = (
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
)
HISTOGRAMS = (
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:request_queue_time_seconds",
    "vllm:request_prefill_time_seconds",
    "vllm:request_decode_time_seconds",
    "vllm:request_prompt_tokens",
    "vllm:request_generation_tokens",
    "vllm:iteration_tokens_total",
)


@pytest.fixture(scope="module")
def daemon(
    tmp_path_factory: pytest.TempPathFactory, model_cache_dir: Path
) -> Iterator[DaemonProcess]:
    with running(
        tmp_path_factory.mktemp("ops-metrics"), model_cache_dir, {"metrics": {"enabled": True}}
    ) as process:
        yield process


@pytest.fixture(scope="module")
def client(daemon: DaemonProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{daemon.base_url}/v1", api_key="unused", max_retries=0)


def test_every_vllm_metric_is_exposed_with_model_name(daemon: DaemonProcess) -> None:
    samples = scrape(daemon)
    names = {name for name, _ in samples}
    for name in (*ENGINE_COUNTERS, "vllm:num_requests_running", "vllm:num_requests_waiting",
                 "vllm:kv_cache_usage_perc"):  # fmt: skip
        assert (name, frozenset({("model_name", MODEL)})) in samples, name
    for name in HISTOGRAMS:
        assert f"{name}_count" in names and f"{name}_bucket" in names, name
    for reason in ("stop", "length", "abort", "error"):
        key = ("vllm:request_success_total", frozenset({("model_name", MODEL),
                                                         ("finished_reason", reason)}))  # fmt: skip
        assert key in samples


def test_prefix_cache_counters_stay_at_zero(daemon: DaemonProcess) -> None:
    samples = scrape(daemon)
    assert value(samples, "vllm:prefix_cache_queries_total", model_name=MODEL) == 0
    assert value(samples, "vllm:prefix_cache_hits_total", model_name=MODEL) == 0


def test_process_and_model_gauges(daemon: DaemonProcess) -> None:
    samples = scrape(daemon)
    assert value(samples, "vllm_mlx_memory_active_bytes") > 0
    assert value(samples, "vllm_mlx_memory_peak_bytes") >= value(
        samples, "vllm_mlx_memory_active_bytes"
    )
    assert value(samples, "vllm_mlx_process_resident_memory_bytes") > 0
    assert value(samples, "vllm_mlx_model_state", model_name=MODEL, state="running") == 1
    assert value(samples, "vllm_mlx_model_state", model_name=MODEL, state="loading") == 0
    assert value(samples, "vllm_mlx_model_load_seconds", model_name=MODEL) > 0


def _delta(before: Samples, after: Samples, name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


def test_counters_and_histograms_move_with_requests(
    daemon: DaemonProcess, client: openai.OpenAI
) -> None:
    before = scrape(daemon)
    usages = []
    # EOS is biased away so every request runs to its length: no unreported EOS token.
    for content in ("Hi", "Name a colour."):
        response = client.chat.completions.create(**chat_body(content, 3, logit_bias=NO_EOS))
        assert response.usage is not None
        usages.append((response.usage.prompt_tokens, response.usage.completion_tokens))
    stream = client.chat.completions.create(
        **chat_body("Count to ten.", 4, logit_bias=NO_EOS),
        stream=True,
        stream_options={"include_usage": True},
    )
    final = [chunk.usage for chunk in stream if chunk.usage is not None]
    usages.append((final[0].prompt_tokens, final[0].completion_tokens))
    completion = client.completions.create(
        model="default", prompt="The sky is", max_tokens=3, logit_bias=NO_EOS
    )
    assert completion.usage is not None
    usages.append((completion.usage.prompt_tokens, completion.usage.completion_tokens))

    after = scrape(daemon)
    served = len(usages)
    prompt = sum(p for p, _ in usages)
    generated = sum(c for _, c in usages)
    m = {"model_name": MODEL}
    assert _delta(before, after, "vllm:time_to_first_token_seconds_count", **m) == served
    assert _delta(before, after, "vllm:e2e_request_latency_seconds_count", **m) == served
    assert _delta(before, after, "vllm:request_queue_time_seconds_count", **m) == served
    assert _delta(before, after, "vllm:prompt_tokens_total", **m) == prompt
    assert _delta(before, after, "vllm:generation_tokens_total", **m) == generated
    assert _delta(before, after, "vllm:request_prompt_tokens_sum", **m) == prompt
    assert _delta(before, after, "vllm:request_generation_tokens_sum", **m) == generated
    # Requests ran one at a time to their length limit: every step's tokens are theirs,
    # less the prompt tokens the prefix cache supplied (they are not computed again).
    cached = _delta(before, after, "vllm:prefix_cache_hits_total", **m)
    assert _delta(before, after, "vllm:prefix_cache_queries_total", **m) == prompt
    assert cached > 0  # the chat prompts share the template's default system prompt
    assert (
        _delta(before, after, "vllm:iteration_tokens_total_sum", **m) == prompt - cached + generated
    )
    hits = _delta(before, after, "vllm_mlx_prefix_cache_hits_total", **m)
    assert hits + _delta(before, after, "vllm_mlx_prefix_cache_misses_total", **m) == served
    assert hits > 0
    held = value(after, "vllm_mlx_prefix_cache_bytes", **m)
    assert 0 < held <= value(after, "vllm_mlx_prefix_cache_max_bytes", **m) == 512 * 2**20
    finished = _delta(before, after, "vllm:request_success_total", finished_reason="length", **m)
    finished += _delta(before, after, "vllm:request_success_total", finished_reason="stop", **m)
    assert finished == served
    # One inter-token gap per token after the first.
    assert (
        _delta(before, after, "vllm:inter_token_latency_seconds_count", **m) == generated - served
    )


def test_http_requests_are_counted_by_route_and_status_class(
    daemon: DaemonProcess, client: openai.OpenAI
) -> None:
    route = {"route": "/v1/models", "method": "GET"}
    before = scrape(daemon)
    client.models.list()
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")
    missing = httpx.get(f"{daemon.base_url}/no/such/path")
    assert missing.status_code == 404

    def counted() -> Samples | None:
        after = scrape(daemon)
        done = _delta(before, after, "vllm_mlx_http_requests_total", status="2xx", **route)
        return after if done == 1 else None

    after = wait_for(counted, 30, "the /v1/models request to be counted")
    templated = {"route": "/v1/models/{model_id}", "method": "GET", "status": "4xx"}
    assert _delta(before, after, "vllm_mlx_http_requests_total", **templated) == 1
    unknown = {"route": "unmatched", "method": "GET", "status": "4xx"}
    assert _delta(before, after, "vllm_mlx_http_requests_total", **unknown) == 1
    assert _delta(before, after, "vllm_mlx_http_request_duration_seconds_count", **route) == 1


def test_running_gauge_follows_a_live_stream(daemon: DaemonProcess) -> None:
    body = chat_body("Tell me a story.", 24, stream=True, logit_bias=NO_EOS)
    done = threading.Event()

    def consume() -> None:
        with httpx.stream("POST", f"{daemon.base_url}/v1/chat/completions", json=body,
                          timeout=300) as response:  # fmt: skip
            for _ in response.iter_lines():
                pass
        done.set()

    worker = threading.Thread(target=consume)
    worker.start()
    try:
        wait_for(
            lambda: (
                value(scrape(daemon), "vllm:num_requests_running", model_name=MODEL) == 1
                or done.is_set()
            ),
            120,
            "the stream to show as running",
        )
        assert not done.is_set(), "the stream ended before it was seen running"
        kv = value(scrape(daemon), "vllm:kv_cache_usage_perc", model_name=MODEL)
        assert 0 < kv <= 1
    finally:
        worker.join(300)
    wait_for(
        lambda: value(scrape(daemon), "vllm:num_requests_running", model_name=MODEL) == 0,
        60,
        "the running gauge to fall back to 0",
    )


def test_timeout_counts_as_an_abort(daemon: DaemonProcess) -> None:
    before = scrape(daemon)
    body = chat_body("Write a long essay.", 4000, logit_bias=NO_EOS, timeout=0.5)
    response = httpx.post(f"{daemon.base_url}/v1/chat/completions", json=body, timeout=120)
    assert response.status_code == 504
    after = scrape(daemon)
    m = {"model_name": MODEL}
    assert _delta(before, after, "vllm_mlx_aborted_requests_total", reason="timeout", **m) == 1
    assert _delta(before, after, "vllm:request_success_total", finished_reason="abort", **m) == 1


def test_the_grafana_dashboard_queries_only_what_this_daemon_exposes(
    daemon: DaemonProcess,
) -> None:
    from tests.unit.test_metrics_dashboard import METRIC_NAME, dashboard, queries

    exposed = {name for name, _ in scrape(daemon)}
    used = {name for expr in queries(dashboard()) for name in METRIC_NAME.findall(expr)}
    assert used and not used - exposed, sorted(used - exposed)
