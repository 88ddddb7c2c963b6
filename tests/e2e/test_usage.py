"""Usage accounting against a real daemon: per key, model and route in SQLite, GET
/v1/usage, the `key` label on /metrics, tokens per minute, daily and monthly quotas
(across a restart, and raised by hot reload), `vllm-mlx keys usage` from the daemon
and from the database, and a SIGKILL losing at most one second of usage."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import yaml

from tests.conftest import DaemonProcess, StartDaemon
from tests.e2e.ops_support import scrape, wait_for
from vllm_mlx.config.auth import key_digest

MAIN = "smollm2-135m-instruct"
EMBED = "all-minilm-l6-v2"
ADMIN = "sk-test-usage-admin-1111"
APP = "sk-test-usage-app-2222"
METERED = "sk-test-usage-metered-3333"  # 60 tokens a day
MONTHLY = "sk-test-usage-monthly-4444"  # 40 tokens a month
TPM = "sk-test-usage-tpm-5555"  # 30 tokens a minute
CHAT = {"model": MAIN, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


def _named(name: str, secret: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "key_sha256": key_digest(secret).hex(), **extra}


def _config(state_dir: Path, day_quota: int = 60) -> dict[str, Any]:
    return {
        "models": [
            {"name": MAIN, "source": f"builtin:{MAIN}", "aliases": ["default"]},
            {"name": EMBED, "source": f"builtin:{EMBED}", "task": "embed"},
        ],
        "paths": {"state_dir": str(state_dir)},
        "metrics": {"enabled": True},
        "auth": {
            "keys": [
                _named("ops", ADMIN, scopes=["admin"]),
                _named("app", APP),
                _named("metered", METERED, quota={"tokens_per_day": day_quota}),
                _named("monthly", MONTHLY, quota={"tokens_per_month": 40}),
                _named("tpm", TPM, rate_limit={"tokens_per_minute": 30}),
            ]
        },
    }


def _post(daemon: DaemonProcess, key: str, body: dict[str, Any] | None = None) -> httpx.Response:
    return httpx.post(
        f"{daemon.base_url}/v1/chat/completions",
        json=body or CHAT,
        headers={"Authorization": f"Bearer {key}"},
        timeout=120,
    )


def _usage(daemon: DaemonProcess, **params: str) -> dict[str, Any]:
    response = httpx.get(
        f"{daemon.base_url}/v1/usage",
        params=params,
        headers={"Authorization": f"Bearer {ADMIN}"},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    report: dict[str, Any] = response.json()
    return report


def _tomorrow() -> str:
    return (dt.datetime.now(dt.UTC).date() + dt.timedelta(days=1)).isoformat()


def test_usage_per_key_model_and_route(start_daemon: StartDaemon, tmp_path: Path) -> None:
    daemon = start_daemon(_config(tmp_path / "state"))
    client = openai.OpenAI(base_url=f"{daemon.base_url}/v1", api_key=APP)
    done = client.chat.completions.create(model="default", messages=CHAT["messages"], max_tokens=3)
    assert done.usage is not None
    streamed = client.chat.completions.create(
        model=MAIN,
        messages=CHAT["messages"],
        max_tokens=3,
        stream=True,
        stream_options={"include_usage": True},
    )
    stream_usage = next(c.usage for c in streamed if c.usage is not None)
    vectors = client.embeddings.create(model=EMBED, input=["one", "two words"])
    assert client.models.list().data

    report = _usage(daemon, key="app")
    rows = {(r["model"], r["route"]): r for r in report["data"]}
    chat = rows[(MAIN, "/v1/chat/completions")]  # the alias is counted under the name
    assert chat["requests"] == 2 and chat["errors"] == 0
    assert chat["prompt_tokens"] == done.usage.prompt_tokens + stream_usage.prompt_tokens
    assert chat["completion_tokens"] == (
        done.usage.completion_tokens + stream_usage.completion_tokens
    )
    assert chat["cached_tokens"] <= chat["prompt_tokens"] and chat["generation_seconds"] > 0
    embedded = rows[(EMBED, "/v1/embeddings")]
    assert embedded["prompt_tokens"] == vectors.usage.prompt_tokens
    assert rows[("", "/v1/models")]["requests"] == 1
    assert {r["key"] for r in report["data"]} == {"app"}
    assert report["totals"]["requests"] == sum(r["requests"] for r in report["data"])
    assert report["keys"][0]["name"] == "app" and report["keys"][0]["tokens_today"] > 0
    assert _usage(daemon, model=EMBED)["totals"]["requests"] == 1
    assert _usage(daemon, since=_tomorrow())["data"] == []

    bad = httpx.get(
        f"{daemon.base_url}/v1/usage?since=yesterday",
        headers={"Authorization": f"Bearer {ADMIN}"},
        timeout=10,
    )
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "since"

    samples = scrape(daemon, {"Authorization": f"Bearer {ADMIN}"})
    labels = frozenset({("key", "app"), ("model", MAIN), ("route", "/v1/chat/completions")})
    assert samples[("vllm_mlx_key_requests_total", labels)] == 2
    tokens = frozenset({("key", "app"), ("model", MAIN), ("kind", "completion")})
    assert samples[("vllm_mlx_key_tokens_total", tokens)] == chat["completion_tokens"]
    metrics_text = httpx.get(
        f"{daemon.base_url}/metrics", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10
    ).text
    assert APP not in metrics_text and key_digest(APP).hex() not in metrics_text


def test_tokens_per_minute(start_daemon: StartDaemon, tmp_path: Path) -> None:
    daemon = start_daemon(_config(tmp_path / "state"))
    assert _post(daemon, TPM).status_code == 200  # ~34 tokens: the minute is overdrawn
    over = _post(daemon, TPM)
    assert over.status_code == 429 and int(over.headers["retry-after"]) >= 1
    assert "30 tokens per minute" in over.json()["error"]["message"]
    assert over.json()["error"]["code"] == "rate_limit_exceeded"
    assert _post(daemon, APP).status_code == 200  # other keys are not held back


def _spend_until_refused(daemon: DaemonProcess, key: str) -> httpx.Response:
    for _ in range(5):
        response = _post(daemon, key)
        if response.status_code != 200:
            return response
    raise AssertionError("the quota never refused")


def test_quotas_bite_across_a_restart_and_follow_reloads(
    start_daemon: StartDaemon, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    first = start_daemon(_config(state))
    refused = _spend_until_refused(first, METERED)
    assert refused.status_code == 429, refused.text
    error = refused.json()["error"]
    assert error["code"] == "insufficient_quota"
    assert "daily quota of 60 tokens" in error["message"]
    assert f"resets at {_tomorrow()}T00:00:00Z" in error["message"]
    assert int(refused.headers["retry-after"]) >= 1
    anthropic = httpx.post(
        f"{first.base_url}/v1/messages",
        json={**CHAT, "max_tokens": 3},
        headers={"x-api-key": METERED, "anthropic-version": "2023-06-01"},
        timeout=30,
    )
    assert anthropic.status_code == 429 and anthropic.json()["error"]["type"] == "rate_limit_error"
    assert httpx.get(
        f"{first.base_url}/v1/models", headers={"Authorization": f"Bearer {METERED}"}, timeout=10
    ).is_success  # reading the model list spends nothing
    monthly = _spend_until_refused(first, MONTHLY)
    assert "monthly quota of 40 tokens" in monthly.json()["error"]["message"]
    spent = _usage(first, key="metered")["totals"]
    first.stop()

    second = start_daemon(_config(state))  # the same database
    assert _usage(second, key="metered")["totals"] == spent
    again = _post(second, METERED)
    assert again.status_code == 429 and "daily quota" in again.json()["error"]["message"]
    assert _post(second, MONTHLY).status_code == 429

    raised = _config(state, day_quota=100_000)
    current = yaml.safe_load(second.config_path.read_text())
    scratch = second.config_path.with_suffix(".tmp")
    scratch.write_text(yaml.safe_dump({**current, "auth": raised["auth"]}, sort_keys=False))
    os.replace(scratch, second.config_path)
    wait_for(lambda: _post(second, METERED).status_code == 200, 60, "the raised quota")


def _keys_usage(
    daemon: DaemonProcess, *args: str, key: str | None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "VLLM_MLX_ADMIN_KEY"}
    if key is not None:
        env["VLLM_MLX_ADMIN_KEY"] = key
    return subprocess.run(
        [sys.executable, "-m", "vllm_mlx.cli", "keys", "usage", "--config",
         str(daemon.config_path), *args],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip


def test_keys_usage_from_the_daemon_and_from_the_database(
    start_daemon: StartDaemon, tmp_path: Path
) -> None:
    daemon = start_daemon(_config(tmp_path / "state"))
    assert _post(daemon, APP).status_code == 200
    live = _keys_usage(daemon, "--json", "--key", "app", key=ADMIN)
    assert live.returncode == 0, live.stderr
    report = json.loads(live.stdout)
    assert report["totals"]["requests"] == 1 and report["data"][0]["model"] == MAIN
    refused = _keys_usage(daemon, key=APP)  # not an admin key
    assert refused.returncode == 1 and "403" in refused.stderr
    table = _keys_usage(daemon, "--since", "7d", key=ADMIN)
    assert table.returncode == 0
    header, *lines = table.stdout.splitlines()
    assert header.split()[:4] == ["day", "key", "model", "route"]
    assert any(line.split()[1:4] == ["app", MAIN, "/v1/chat/completions"] for line in lines)
    assert lines[-1].startswith("total")
    final = _usage(daemon, key="app")["totals"]  # the refused call counted too (an error)
    assert final["requests"] == 2 and final["errors"] == 1
    daemon.stop()

    stopped = _keys_usage(daemon, "--json", "--key", "app", key=None)
    assert stopped.returncode == 0 and "no daemon answers" in stopped.stderr
    assert json.loads(stopped.stdout)["totals"] == final
    bad = _keys_usage(daemon, "--since", "last week", key=None)
    assert bad.returncode == 2


def test_sigkill_loses_at_most_a_second(start_daemon: StartDaemon, tmp_path: Path) -> None:
    """Requests keep finishing while the daemon is killed; the database, read after a
    restart, holds every request that finished more than a second before the kill."""
    state = tmp_path / "state"
    daemon = start_daemon(_config(state))
    finished: list[float] = []  # when each 200 came back (monotonic)
    started = [0]
    stop = threading.Event()

    def load() -> None:
        with httpx.Client(timeout=60) as http:
            while not stop.is_set():
                started[0] += 1
                try:
                    response = http.post(
                        f"{daemon.base_url}/v1/chat/completions",
                        json={**CHAT, "max_tokens": 1},
                        headers={"Authorization": f"Bearer {APP}"},
                    )
                except httpx.TransportError:
                    return  # killed
                if response.status_code == 200:
                    finished.append(time.monotonic())

    workers = [threading.Thread(target=load) for _ in range(2)]
    for worker in workers:
        worker.start()
    try:
        wait_for(
            lambda: sum(t < time.monotonic() - 1.5 for t in finished) >= 5,
            120,
            "requests finished well before the kill",
        )
        killed_at = time.monotonic()
        daemon.process.send_signal(signal.SIGKILL)
        daemon.process.wait(30)
    finally:
        stop.set()
        for worker in workers:
            worker.join(60)
    must_have = sum(t <= killed_at - 1.0 for t in finished)

    restarted = start_daemon(_config(state))
    rows = _usage(restarted, key="app", route="/v1/chat/completions")["data"]
    counted = sum(r["requests"] for r in rows)
    assert must_have <= counted <= started[0], (must_have, counted, started[0])


def test_usage_off_by_config(start_daemon: StartDaemon, tmp_path: Path) -> None:
    config = _config(tmp_path / "state")
    config["auth"]["keys"] = config["auth"]["keys"][:2]  # quotas need the accounting
    config["usage"] = {"enabled": False}
    daemon = start_daemon(config)
    assert _post(daemon, APP).status_code == 200
    off = httpx.get(
        f"{daemon.base_url}/v1/usage", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10
    )
    assert off.status_code == 503 and "usage.enabled" in off.json()["error"]["message"]
    assert not (tmp_path / "state" / "usage.sqlite3").exists()
