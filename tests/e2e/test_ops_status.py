"""/v1/status against a real daemon (default config: no keys, metrics off)."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import DaemonProcess
from tests.e2e.ops_support import MODEL, NO_EOS, chat_body, status, wait_for
from vllm_mlx.models.cpu import qmm

SEED_FIELDS = (
    "status", "model", "uptime_s", "steps_executed", "num_running", "num_waiting",
    "total_requests_processed", "total_prompt_tokens", "total_completion_tokens",
    "memory", "cache", "requests",
)  # fmt: skip
REQUEST_FIELDS = (
    "request_id", "phase", "tokens_per_second", "ttft_s", "progress", "cache_hit_type",
    "cached_tokens", "generated_tokens", "max_tokens",
)  # fmt: skip


def test_idle_status_has_the_seed_fields(shared_daemon: DaemonProcess) -> None:
    # The embedding model, second in the default config, loads on demand.
    before = {b["model"]: b for b in status(shared_daemon)["models"]}
    if before["all-minilm-l6-v2"]["state"] == "not_loaded":  # no earlier test used it
        assert before["all-minilm-l6-v2"]["residency"]["load"] == "on_demand"
        url = f"{shared_daemon.base_url}/v1/models/all-minilm-l6-v2/load"
        assert httpx.post(url, timeout=60).status_code == 200
    document = status(shared_daemon)
    for field in SEED_FIELDS:
        assert field in document, field
    assert document["status"] == "running"
    assert document["model"] == MODEL
    assert document["uptime_s"] > 0
    assert document["memory"]["active_gb"] > 0
    assert document["memory"]["peak_gb"] >= document["memory"]["active_gb"]
    # The prefix cache is on by default and empty before the first request.
    assert document["cache"] == {"type": "paged", "entries": 0, "hit_rate": 0.0, "memory_mb": 0.0}
    # The default config also serves the bundled embedding and speech models.
    block, embedding, speech = document["models"]
    assert block["model"] == MODEL and block["status"] == "running"
    assert block["task"] == "generate" and embedding["task"] == "embed"
    assert embedding["status"] == "running" and embedding["embedding"]["dimensions"] == 384
    assert speech["task"] == "transcribe" and speech["residency"]["load"] == "on_demand"
    assert Path(document["config"]["path"]).resolve() == shared_daemon.config_path.resolve()
    assert document["config"]["last_error"] is None
    # The bundled model on the CPU kernel: its pool policy, measured at load.
    if sys.platform == "linux" and qmm.status().available:
        pool = document["kernel_pool"]
        assert pool["chosen_by"] == "measured" and pool["policy"] in ("conservative", "eager")
    else:
        assert document["kernel_pool"] is None


def test_status_of_a_loaded_speech_model(shared_daemon: DaemonProcess) -> None:
    url = f"{shared_daemon.base_url}/v1/models/whisper-tiny-en/load"
    assert httpx.post(url, timeout=120).status_code == 200
    block = {b["model"]: b for b in status(shared_daemon)["models"]}["whisper-tiny-en"]
    assert block["status"] == "running" and block["task"] == "transcribe"
    assert block["speech"] == {"multilingual": False, "audio_seconds": 0.0, "requests_queued": 0}
    assert block["total_requests_processed"] == 0 and block["requests"] == []
    assert block["residency"]["weights_mb"] > 50  # tiny.en in float32: ~150 MB


def test_status_shows_a_running_stream(shared_daemon: DaemonProcess) -> None:
    before = status(shared_daemon)
    body = chat_body("Tell me about the sea.", 20, stream=True, logit_bias=NO_EOS)
    ids: list[str] = []
    done = threading.Event()

    def consume() -> None:
        with httpx.stream("POST", f"{shared_daemon.base_url}/v1/chat/completions", json=body,
                          timeout=300) as response:  # fmt: skip
            for line in response.iter_lines():
                if line.startswith("data: {") and not ids:
                    ids.append(httpx.Response(200, content=line[6:]).json()["id"])
        done.set()

    worker = threading.Thread(target=consume)
    worker.start()
    try:

        def generating() -> dict[str, Any] | None:
            document = status(shared_daemon)
            live = [r for r in document["requests"] if r["phase"] == "generation"]
            return document if live and live[0]["generated_tokens"] >= 2 else None

        during = wait_for(generating, 120, "the stream to be generating")
        assert not done.is_set()
    finally:
        worker.join(300)
    [request] = during["requests"]
    for field in REQUEST_FIELDS:
        assert field in request, field
    assert request["request_id"] == ids[0]
    assert request["max_tokens"] == 20
    assert request["ttft_s"] > 0 and request["tokens_per_second"] > 0
    assert 0 < request["progress"] <= 1
    assert request["cache_hit_type"] == "none" and request["cached_tokens"] == 0
    assert during["num_running"] == 1 and during["num_waiting"] == 0
    assert during["steps_executed"] > before["steps_executed"]

    after = wait_for(
        lambda: (d := status(shared_daemon))["num_running"] == 0 and d, 60, "the stream to end"
    )
    assert after["requests"] == []
    assert after["total_requests_processed"] == before["total_requests_processed"] + 1
    assert after["total_completion_tokens"] >= before["total_completion_tokens"] + 20


def test_metrics_are_off_by_default(shared_daemon: DaemonProcess) -> None:
    response = httpx.get(f"{shared_daemon.base_url}/metrics")
    assert response.status_code == 404
    assert "metrics.enabled" in response.json()["error"]["message"]


def test_health_and_status_need_no_key_when_none_is_configured(
    shared_daemon: DaemonProcess,
) -> None:
    assert httpx.get(f"{shared_daemon.base_url}/health").status_code == 200
    assert httpx.get(f"{shared_daemon.base_url}/v1/status").status_code == 200
