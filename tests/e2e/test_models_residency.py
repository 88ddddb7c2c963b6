"""Many models, one memory budget (docs/models.md), against one real daemon.

Four copies of the bundled model under different names. With an 8 MiB prefix cache each
holds ~102 MiB against the budget once loaded (94 MiB of 4-bit weights plus the cache's
bound) and is estimated at ~118 MiB before its first load (its file size; then its
measured size), so a 280 MiB budget holds two of them and a third evicts one. Each
test sets up the residency it needs with the load/unload endpoints, so they do not
depend on each other's order.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import psutil
import pytest
import yaml

from tests.conftest import DaemonProcess, running
from tests.e2e.ops_support import NO_EOS, Samples, scrape, value, wait_for

KEY = "sk-residency-test"
AUTH = {"Authorization": f"Bearer {KEY}"}
BUILTIN = "builtin:smollm2-135m-instruct"
NAMES = ("alpha", "bravo", "charlie", "delta")
BUDGET_MB = 280
# RSS is compared with the weights /v1/status reports: a load or an unload moves RSS by
# the weights within this share, plus allocator slack (measured here: +17 % on load).
RSS_TOLERANCE = 0.4
RSS_SLACK = 24 * 2**20


@pytest.fixture(scope="module")
def daemon(
    tmp_path_factory: pytest.TempPathFactory, model_cache_dir: Path
) -> Iterator[DaemonProcess]:
    config = {
        "models": [
            {"name": "alpha", "source": BUILTIN},  # the first: loaded at startup
            {"name": "bravo", "source": BUILTIN},
            {"name": "charlie", "source": BUILTIN},
            {"name": "delta", "source": BUILTIN, "keep_alive": 1},
        ],
        "engine": {"cache_memory_mb": 8},
        "memory": {"budget_mb": BUDGET_MB},
        "auth": {"api_keys": [KEY]},
        "metrics": {"enabled": True},
    }
    with running(tmp_path_factory.mktemp("residency"), model_cache_dir, config) as process:
        yield process


def status(daemon: DaemonProcess) -> dict[str, Any]:
    response = httpx.get(f"{daemon.base_url}/v1/status", headers=AUTH, timeout=10)
    assert response.status_code == 200, response.text
    document: dict[str, Any] = response.json()
    return document


def states(daemon: DaemonProcess) -> dict[str, str]:
    return {b["model"]: b["state"] for b in status(daemon)["models"]}


def control(daemon: DaemonProcess, name: str, action: str) -> httpx.Response:
    url = f"{daemon.base_url}/v1/models/{name}/{action}"
    return httpx.post(url, headers=AUTH, timeout=120)


def only_loaded(daemon: DaemonProcess, *names: str) -> None:
    """Unload every other model, then load `names` in order (the last is the most recent)."""
    for name in NAMES:
        if name not in names:
            assert control(daemon, name, "unload").status_code == 200
    for name in names:
        assert control(daemon, name, "load").status_code == 200
    assert {n for n, s in states(daemon).items() if s == "running"} == set(names)


def chat(daemon: DaemonProcess, model: str, **extra: Any) -> Any:
    api = openai.OpenAI(base_url=f"{daemon.base_url}/v1", api_key=KEY, max_retries=0)
    return api.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=2, **extra
    )


def metric(daemon: DaemonProcess, name: str, **labels: str) -> float:
    return value(scrape(daemon, AUTH), name, **labels)


def edit_config(daemon: DaemonProcess, change: dict[str, Any]) -> None:
    """Rewrite the daemon's file with `change` per model name (or `memory`): a hot reload."""
    data = yaml.safe_load(daemon.config_path.read_text())
    for model in data["models"]:
        model.update(change.get(model["name"], {}))
    if "memory" in change:
        data["memory"] = change["memory"]
    daemon.config_path.write_text(yaml.safe_dump(data, sort_keys=False))


def residency(daemon: DaemonProcess, name: str) -> dict[str, Any]:
    block = next(b for b in status(daemon)["models"] if b["model"] == name)
    result: dict[str, Any] = block["residency"]
    return result


def test_an_on_demand_model_loads_on_its_first_request(daemon: DaemonProcess) -> None:
    only_loaded(daemon, "alpha")
    health = httpx.get(f"{daemon.base_url}/health", timeout=10)
    assert health.status_code == 200  # alpha serves; the others can load on demand
    ready = {m["name"]: m["ready"] for m in health.json()["models"]}
    assert ready == {"alpha": True, "bravo": False, "charlie": False, "delta": False}
    before = scrape(daemon, AUTH)

    assert chat(daemon, "bravo").choices[0].message.content  # waits for the load

    after = scrape(daemon, AUTH)
    assert states(daemon)["bravo"] == "running"
    loads = "vllm_mlx_model_loads_total"
    assert _delta(before, after, loads, model_name="bravo", outcome="ok") == 1
    duration = "vllm_mlx_model_load_duration_seconds_count"
    assert _delta(before, after, duration, model_name="bravo") == 1
    assert value(after, "vllm_mlx_model_memory_bytes", model_name="bravo") > 90 * 2**20
    assert value(after, "vllm_mlx_model_memory_budget_bytes") == BUDGET_MB * 2**20


def _delta(before: Samples, after: Samples, name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


def test_the_least_recently_used_model_is_evicted_and_a_pinned_one_never(
    daemon: DaemonProcess,
) -> None:
    only_loaded(daemon, "bravo", "alpha")  # alpha used last: bravo is the LRU
    evicted = metric(daemon, "vllm_mlx_model_evictions_total", model_name="bravo")
    chat(daemon, "charlie")
    assert states(daemon) == {
        "alpha": "running", "bravo": "not_loaded", "charlie": "running", "delta": "not_loaded"
    }  # fmt: skip
    assert metric(daemon, "vllm_mlx_model_evictions_total", model_name="bravo") == evicted + 1

    # Pinned (a hot reload), alpha stays although it is now the least recently used.
    edit_config(daemon, {"alpha": {"pin": True}})
    try:
        wait_for(lambda: residency(daemon, "alpha")["pinned"], 30, "pin applied")
        chat(daemon, "bravo")
        assert states(daemon) == {
            "alpha": "running", "bravo": "running", "charlie": "not_loaded", "delta": "not_loaded"
        }  # fmt: skip
    finally:
        edit_config(daemon, {"alpha": {"pin": False}})
        wait_for(lambda: not residency(daemon, "alpha")["pinned"], 30, "pin removed")


def test_503_when_nothing_can_be_evicted_and_a_stream_is_undisturbed(
    daemon: DaemonProcess,
) -> None:
    only_loaded(daemon, "alpha", "bravo")
    edit_config(daemon, {"alpha": {"pin": True}})
    chunks: list[str] = []
    api = openai.OpenAI(base_url=f"{daemon.base_url}/v1", api_key=KEY, max_retries=0)
    stream = api.chat.completions.create(
        model="bravo",
        messages=[{"role": "user", "content": "Count to a thousand."}],
        max_tokens=3000,
        logit_bias=NO_EOS,
        stream=True,
    )

    def read() -> None:
        try:
            for chunk in stream:
                chunks.append(chunk.choices[0].delta.content or "" if chunk.choices else "")
        except openai.APIConnectionError:
            pass  # closed by the test once it has seen enough

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        wait_for(lambda: residency(daemon, "alpha")["pinned"], 30, "pin applied")
        wait_for(lambda: len(chunks) > 2, 60, "the stream to start")
        # alpha is pinned and bravo busy: charlie cannot fit, in each protocol's shape.
        with pytest.raises(openai.APIStatusError) as raised:
            chat(daemon, "charlie")
        assert raised.value.status_code == 503
        error = raised.value.body
        assert isinstance(error, dict) and error["type"] == "service_unavailable_error"
        assert "alpha" in error["message"] and "bravo" in error["message"]
        claude = anthropic.Anthropic(base_url=daemon.base_url, api_key=KEY, max_retries=0)
        with pytest.raises(anthropic.APIStatusError) as refused:
            claude.messages.create(
                model="charlie", max_tokens=2, messages=[{"role": "user", "content": "hi"}]
            )
        assert refused.value.status_code == 503
        body = refused.value.body
        assert isinstance(body, dict) and body["type"] == "error"
        assert "bravo" in body["error"]["message"]
        responses = httpx.post(
            f"{daemon.base_url}/v1/responses",
            headers=AUTH,
            json={"model": "charlie", "input": "hi", "max_output_tokens": 16},
            timeout=30,
        )
        assert responses.status_code == 503
        assert responses.json()["error"]["code"] == "model_memory_budget"

        # A busy model is never unloaded; an idle one is, under the running stream.
        busy = control(daemon, "bravo", "unload")
        assert busy.status_code == 409 and busy.json()["error"]["code"] == "model_busy"
        assert control(daemon, "alpha", "unload").json()["state"] == "not_loaded"
        seen = len(chunks)
        wait_for(lambda: len(chunks) >= seen + 20, 60, "the stream to go on")
        assert reader.is_alive() and states(daemon)["bravo"] == "running"
    finally:
        stream.close()
        edit_config(daemon, {"alpha": {"pin": False}})
        wait_for(lambda: not residency(daemon, "alpha")["pinned"], 30, "pin removed")
    assert "".join(chunks).strip()


def test_concurrent_first_requests_share_one_load(daemon: DaemonProcess) -> None:
    only_loaded(daemon, "alpha")
    loads = metric(daemon, "vllm_mlx_model_loads_total", model_name="charlie", outcome="ok")
    replies: list[Any] = []
    threads = [
        threading.Thread(target=lambda: replies.append(chat(daemon, "charlie"))) for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert len(replies) == 4
    assert metric(daemon, "vllm_mlx_model_loads_total", model_name="charlie", outcome="ok") == (
        loads + 1
    )


def test_an_idle_model_unloads_after_keep_alive(daemon: DaemonProcess) -> None:
    only_loaded(daemon, "alpha")
    idle = metric(daemon, "vllm_mlx_model_unloads_total", model_name="delta", reason="idle")
    chat(daemon, "delta")  # keep_alive: 1
    wait_for(lambda: states(daemon)["delta"] == "not_loaded", 30, "delta to unload")
    assert metric(daemon, "vllm_mlx_model_unloads_total", model_name="delta", reason="idle") == (
        idle + 1
    )
    assert states(daemon)["alpha"] == "running"  # keep_alive -1: stays


def test_keep_alive_and_the_budget_hot_reload(daemon: DaemonProcess) -> None:
    only_loaded(daemon, "alpha", "charlie")
    edit_config(daemon, {"charlie": {"keep_alive": 1}})
    try:
        wait_for(lambda: states(daemon)["charlie"] == "not_loaded", 30, "charlie to unload")
    finally:
        edit_config(daemon, {"charlie": {"keep_alive": -1}})
    only_loaded(daemon, "alpha", "charlie")
    # A budget for one model: the least recently used idle one goes at once.
    edit_config(daemon, {"memory": {"budget_mb": 150}})
    try:
        wait_for(lambda: states(daemon)["alpha"] == "not_loaded", 30, "alpha evicted")
        document = status(daemon)
        assert document["memory"]["budget_mb"] == 150
        assert 0 < document["memory"]["models_mb"] <= 150
        assert states(daemon)["charlie"] == "running"
    finally:
        edit_config(daemon, {"memory": {"budget_mb": BUDGET_MB}})
        wait_for(lambda: status(daemon)["memory"]["budget_mb"] == BUDGET_MB, 30, "budget back")


def test_memory_figures_follow_rss(daemon: DaemonProcess) -> None:
    process = psutil.Process(daemon.process.pid)
    only_loaded(daemon, "alpha")
    document = status(daemon)
    rss = process.memory_info().rss
    # /v1/status reads the same process's RSS: equal up to what moved between the reads.
    assert abs(document["memory"]["rss_gb"] * 2**30 - rss) <= 0.1 * rss
    assert document["memory"]["models_mb"] * 2**20 < rss
    before = process.memory_info().rss
    loaded = control(daemon, "bravo", "load").json()
    weights = loaded["weights_mb"] * 2**20
    grown = process.memory_info().rss - before
    assert abs(grown - weights) <= RSS_TOLERANCE * weights + RSS_SLACK, (grown, weights)
    before = process.memory_info().rss
    control(daemon, "bravo", "unload")
    freed = before - process.memory_info().rss
    assert abs(freed - weights) <= RSS_TOLERANCE * weights + RSS_SLACK, (freed, weights)


def test_model_control_errors(daemon: DaemonProcess) -> None:
    unknown = control(daemon, "nope", "load")
    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] == "model_not_found"
    url = f"{daemon.base_url}/v1/models/alpha/load"
    assert httpx.post(url, timeout=10).status_code == 401  # behind the API key
    reboot = f"{daemon.base_url}/v1/models/alpha/reboot"
    wrong = httpx.post(reboot, headers=AUTH, json={}, timeout=10)
    assert wrong.status_code == 404 and "load or /unload" in wrong.json()["error"]["message"]
    bodyless = httpx.post(reboot, headers=AUTH, timeout=10)  # as curl -X POST sends it
    assert bodyless.status_code == 404 and "load or /unload" in bodyless.text
    assert control(daemon, "delta", "unload").json()["changed"] is False  # not loaded


def test_the_cli_shows_and_controls_the_running_daemon(daemon: DaemonProcess) -> None:
    only_loaded(daemon, "alpha")
    base = [sys.executable, "-m", "vllm_mlx.cli", "models"]
    config = ["--config", str(daemon.config_path)]  # its port and its key
    done = subprocess.run(
        [*base, "load", "charlie", *config], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "charlie: load done; now running" in done.stdout
    listed = subprocess.run(
        [*base, *config, "--json"], capture_output=True, text=True, timeout=120, check=True
    )
    rows = {row["name"]: row["daemon"] for row in json.loads(listed.stdout)}
    assert rows["charlie"]["state"] == "running" and rows["charlie"]["memory_mb"] > 90
    assert rows["bravo"]["state"] == "not_loaded" and rows["bravo"]["idle_s"] is None
    assert rows["alpha"]["idle_s"] >= 0
    done = subprocess.run(
        [*base, "unload", "charlie", *config], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and states(daemon)["charlie"] == "not_loaded"
    missing = subprocess.run(
        [*base, "unload", "nope", *config], capture_output=True, text=True, timeout=120
    )
    assert missing.returncode == 1 and "404" in missing.stderr


def reloads(daemon: DaemonProcess) -> float:
    """Reloads finished so far, failed or not (vllm_mlx_config_reloads_total)."""
    samples = scrape(daemon, AUTH)
    name = "vllm_mlx_config_reloads_total"
    return value(samples, name, result="success") + value(samples, name, result="failure")


def full_reload(daemon: DaemonProcess, change: dict[str, Any]) -> dict[str, Any]:
    """Edit a model key (a change the file watcher leaves pending), then SIGHUP; the
    config block of /v1/status once that reload has finished, failed or not."""
    edit_config(daemon, change)
    wait_for(lambda: status(daemon)["config"]["pending_changes"], 30, "the change to be pending")
    done = reloads(daemon)
    daemon.process.send_signal(signal.SIGHUP)
    wait_for(lambda: reloads(daemon) > done, 120, "the reload to finish")
    config: dict[str, Any] = status(daemon)["config"]
    return config


def test_a_full_reload_makes_room_under_the_budget_or_changes_nothing(
    daemon: DaemonProcess,
) -> None:
    only_loaded(daemon, "bravo", "alpha")  # ~204 of 280 MiB; bravo is the LRU
    # As float32 alpha's new engine (~600 MiB) cannot fit beside anything: refused whole.
    config = full_reload(daemon, {"alpha": {"dtype": "float32"}})
    try:
        assert "memory budget" in config["last_error"] and "alpha" in config["last_error"]
        assert states(daemon)["alpha"] == states(daemon)["bravo"] == "running"
        assert chat(daemon, "alpha").choices[0].message.content is not None
    finally:
        edit_config(daemon, {"alpha": {"dtype": "auto"}})
        wait_for(lambda: not status(daemon)["config"]["pending_changes"], 30, "file reverted")
    # A new alpha engine (~126 MiB estimated) beside the old one needs bravo's room.
    evicted = metric(daemon, "vllm_mlx_model_evictions_total", model_name="bravo")
    config = full_reload(daemon, {"alpha": {"context_length": 4096}})
    try:
        assert config["last_error"] is None and config["pending_changes"] == []
        assert states(daemon)["alpha"] == "running" and states(daemon)["bravo"] == "not_loaded"
        assert metric(daemon, "vllm_mlx_model_evictions_total", model_name="bravo") == (evicted + 1)
        assert chat(daemon, "alpha").choices[0].message.content is not None
    finally:
        full_reload(daemon, {"alpha": {"context_length": None}})
