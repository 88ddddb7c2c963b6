"""Start-up failures against the real daemon process: a model that fails to load (alone:
a non-zero exit; among several: the others serve and the failure is reported), a port
already taken, and a config file whose API keys others can read."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import httpx
import openai
import pytest

from tests.conftest import STARTUP_TIMEOUT_S, StartDaemon
from tests.e2e.lifecycle_helpers import client, status

BUILTIN = "builtin:smollm2-135m-instruct"


def not_a_model(tmp_path: Path) -> Path:
    """Passes config validation (config.json, a .safetensors file) but cannot load."""
    directory = tmp_path / "broken-model"
    directory.mkdir()
    (directory / "config.json").write_text('{"model_type": "llama"}\n')
    (directory / "model.safetensors").write_bytes(b"not safetensors")
    return directory


def test_the_only_model_failing_to_load_fails_startup(
    start_daemon: StartDaemon, tmp_path: Path
) -> None:
    broken = not_a_model(tmp_path)
    daemon = start_daemon({"models": [{"name": "broken", "source": str(broken)}]}, wait=False)
    # Before the fix it kept answering 503 "loading" and never exited.
    code = daemon.process.wait(STARTUP_TIMEOUT_S)
    log = daemon.log_text()
    assert code == 1, log
    assert "no model could be loaded" in log
    assert "broken" in log and "model.safetensors" in log  # which model, and the reason


def test_the_other_models_serve_and_the_failed_one_is_reported(
    start_daemon: StartDaemon, tmp_path: Path
) -> None:
    broken = not_a_model(tmp_path)
    models = [
        {"name": "broken", "source": str(broken)},
        {"name": "good", "source": BUILTIN, "aliases": ["default"], "load": "startup"},
    ]
    daemon = start_daemon({"models": models}, wait=False)
    daemon.wait_healthy()

    health = httpx.get(f"{daemon.base_url}/health", timeout=10)
    assert health.status_code == 200
    body = health.json()
    assert body["status"] == "degraded"
    by_name = {m["name"]: m for m in body["models"]}
    assert by_name["good"]["state"] == "running"
    assert by_name["broken"]["state"] == "failed"
    assert "model.safetensors" in by_name["broken"]["error"]

    document = status(daemon)
    blocks = {b["model"]: b for b in document["models"]}
    assert blocks["broken"]["status"] == "failed" and blocks["broken"]["error"]
    assert blocks["good"]["status"] == "running"
    assert document["status"] == "running"

    api = client(daemon)
    reply = api.chat.completions.create(
        model="good", messages=[{"role": "user", "content": "Hi"}], max_tokens=2
    )
    assert reply.choices[0].message.content
    with pytest.raises(openai.APIStatusError) as caught:
        api.chat.completions.create(
            model="broken", messages=[{"role": "user", "content": "Hi"}], max_tokens=2
        )
    assert caught.value.status_code == 503
    assert "failed to load" in caught.value.message
    assert daemon.process.poll() is None


def test_startup_warns_when_the_config_with_keys_is_readable_by_others(
    start_daemon: StartDaemon, tmp_path: Path
) -> None:
    # A model that fails fast keeps this cheap: the warning comes before any loading.
    models = [{"name": "broken", "source": str(not_a_model(tmp_path))}]
    key = "sk-local-test-key-4f1c9e"
    previous = os.umask(0o022)  # the config file is written 0644
    try:
        daemon = start_daemon({"models": models, "auth": {"api_keys": [key]}}, wait=False)
    finally:
        os.umask(previous)
    assert daemon.process.wait(STARTUP_TIMEOUT_S) == 1, daemon.log_text()
    log = daemon.log_text()
    # Substrings, not json.loads: the loader thread logs its failure at the same moment,
    # and two threads' lines may share a line of the file.
    (line,) = [line for line in log.splitlines() if "config file readable by others" in line]
    assert '"level": "warning"' in line and f"{daemon.config_path} holds auth.api_keys" in line
    assert key not in log


def test_a_port_already_taken_is_one_clear_line_and_exit_1(start_daemon: StartDaemon) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        daemon = start_daemon(wait=False, args=["--port", str(port)])
        assert daemon.process.wait(STARTUP_TIMEOUT_S) == 1
    log = daemon.log_text()
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in log
    assert "Traceback" not in log


def test_a_taken_ollama_port_is_one_clear_line_and_exit_1(start_daemon: StartDaemon) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        daemon = start_daemon({"ollama": {"listen": f"127.0.0.1:{port}"}}, wait=False)
        assert daemon.process.wait(STARTUP_TIMEOUT_S) == 1
    log = daemon.log_text()
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in log
    assert "Traceback" not in log
