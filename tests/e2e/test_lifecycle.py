"""Hot reload and SIGHUP against the real daemon process, driven as an operator would."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import DaemonProcess, StartDaemon, free_port
from tests.e2e.lifecycle_helpers import (
    Stream,
    client,
    edit_config,
    get,
    listening_lines,
    pid_file,
    poll,
    run_env,
    status,
    vllm_mlx,
    write_like_an_editor,
)
from vllm_mlx.models.cpu import qmm

BUILTIN = "builtin:smollm2-135m-instruct"


def kernel_in_use() -> bool:
    """The bundled model's `dtype: auto` runs on the CPU kernel (Linux, extension built)."""
    return sys.platform == "linux" and qmm.status().available


def test_edit_swaps_api_key_and_hot_settings_with_same_pid(
    start_daemon: StartDaemon, tmp_path: Path
) -> None:
    daemon = start_daemon({"auth": {"api_keys": ["old-key"]}}, env=run_env(tmp_path))
    pid = daemon.process.pid
    stream = Stream(client(daemon, "old-key"), max_tokens=64)
    stream.wait_started()
    edit_config(
        daemon,
        {
            "auth": {"api_keys": ["new-key"]},
            "defaults": {"max_tokens": 2},
            # Only the chat model's aliases change (hot); the default embedding and speech
            # models stay.
            "models": [
                {"name": "smollm2-135m-instruct", "source": BUILTIN, "aliases": ["fresh"]},
                {"name": "all-minilm-l6-v2", "source": "builtin:all-minilm-l6-v2", "task": "embed"},
                {
                    "name": "whisper-tiny-en",
                    "source": "builtin:whisper-tiny-en",
                    "task": "transcribe",
                },
            ],
        },
    )
    poll(lambda: get(daemon, "/v1/models", "new-key") == 200, "the new key to be accepted")
    assert not stream.done, "the stream ended before the reload: nothing was tested"
    assert get(daemon, "/v1/models", "old-key") == 401
    assert daemon.process.poll() is None
    assert int(pid_file(tmp_path, daemon.port).read_text()) == pid == daemon.process.pid
    assert listening_lines(daemon) == 1  # the listener was never rebound

    # The stream began under the old key and the old defaults, and ends under them.
    stream.wait()
    assert stream.error is None
    assert (stream.finish_reason, stream.completion_tokens) == ("length", 64)

    api = client(daemon, "new-key")
    reply = api.chat.completions.create(
        model="fresh", messages=[{"role": "user", "content": "Hi"}], temperature=0
    )
    assert reply.usage is not None and reply.usage.completion_tokens <= 2  # defaults.max_tokens
    with pytest.raises(openai.NotFoundError):
        api.models.retrieve("default")  # the old alias is gone
    assert status(daemon, "new-key")["config"]["last_error"] is None


def config_reloads(daemon: DaemonProcess) -> dict[str, float]:
    text = httpx.get(f"{daemon.base_url}/metrics", timeout=10).text
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name == "vllm_mlx_config_reloads":
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    counts[sample.labels["result"]] = sample.value
    return counts


BAD_EDITS = [
    # (file text, expected line, expected key path or message)
    ("server:\n  timeout: 30\n  host: [unclosed\n", 4, "YAML syntax error"),
    ("server:\n  timeout: 30\n  prot: 1\n", 3, "server.prot: unknown key"),
    ("server:\n  timeout: 30\ndefaults:\n  max_tokens: lots\n", 4, "defaults.max_tokens:"),
]


def test_invalid_edits_keep_the_last_good_config(start_daemon: StartDaemon) -> None:
    daemon = start_daemon({"metrics": {"enabled": True}, "defaults": {"max_tokens": 3}})
    good = daemon.config_path.read_text()
    before = config_reloads(daemon)
    for attempt, (text, line, expected) in enumerate(BAD_EDITS, start=1):
        write_like_an_editor(daemon.config_path, text)
        poll(
            lambda attempt=attempt: (
                config_reloads(daemon)["failure"] == before["failure"] + attempt
            ),
            f"rejected edit {attempt} to be counted",
        )
        error = status(daemon)["config"]["last_error"]
        assert f"{daemon.config_path}:{line}:" in error and expected in error, error
        assert expected in daemon.log_text()
        # Still serving, on the old config (metrics on, max_tokens 3).
        reply = client(daemon).chat.completions.create(
            model="default", messages=[{"role": "user", "content": "Hi"}], temperature=0
        )
        assert reply.usage is not None and reply.usage.completion_tokens <= 3
    write_like_an_editor(daemon.config_path, good)
    poll(lambda: status(daemon)["config"]["last_error"] is None, "the fixed file to load")
    assert config_reloads(daemon)["success"] == before["success"] + 1


def test_sighup_switches_model_while_a_request_finishes_on_the_old(
    start_daemon: StartDaemon, tmp_path: Path
) -> None:
    first = {"name": "first", "source": BUILTIN, "aliases": ["default"]}
    daemon = start_daemon({"models": [first]}, env=run_env(tmp_path))
    pid = daemon.process.pid
    edit_config(daemon, {"models": [{**first, "name": "second"}]})
    poll(
        lambda: status(daemon)["config"]["pending_changes"] == ["models[0].name (model)"],
        "the model change to be listed as pending",
    )
    assert get(daemon, "/v1/models/first") == 200  # not applied by the file watcher
    stream = Stream(client(daemon), model="first", max_tokens=128)
    stream.wait_started()

    result = vllm_mlx("reload", "--config", str(daemon.config_path), env=run_env(tmp_path))
    assert result.returncode == 0, result.stderr
    assert f"pid {pid}" in result.stdout

    poll(lambda: get(daemon, "/v1/models/second") == 200, "the new model to be served")
    assert not stream.done, "the stream ended before the switch: nothing was tested"
    assert get(daemon, "/v1/models/first") == 404
    assert "old model engines stopped" not in daemon.log_text()  # still serving the stream
    stream.wait()
    assert stream.error is None and stream.finish_reason == "length"
    assert stream.completion_tokens == 128
    reply = client(daemon).chat.completions.create(
        model="second", messages=[{"role": "user", "content": "Hi"}], max_tokens=3
    )
    assert reply.model == "second" and reply.choices[0].message.content
    assert status(daemon)["config"]["pending_changes"] == []
    poll(lambda: "old model engines stopped" in daemon.log_text(), "the old engine to stop")
    assert daemon.process.pid == pid and daemon.process.poll() is None


def test_sighup_moves_the_listener_with_same_pid(start_daemon: StartDaemon, tmp_path: Path) -> None:
    daemon = start_daemon(env=run_env(tmp_path))
    old_port, new_port = daemon.port, free_port()
    edit_config(daemon, {"server": {"port": new_port}})
    poll(
        lambda: status(daemon)["config"]["pending_changes"] == ["server.port (restart)"],
        "the port change to be pending",
    )
    daemon.process.send_signal(signal.SIGHUP)
    poll(lambda: get(daemon, "/health", port=new_port) == 200, "the new port to answer")
    poll(lambda: get(daemon, "/health", port=old_port) == 0, "the old port to close")
    assert daemon.process.poll() is None
    assert int(pid_file(tmp_path, new_port).read_text()) == daemon.process.pid
    assert not pid_file(tmp_path, old_port).exists()
    daemon.port = new_port  # so the fixture stops it where it now listens


def test_sigusr1_logs_every_threads_stack_while_a_request_runs_on(
    start_daemon: StartDaemon, tmp_path: Path
) -> None:
    """`kill -USR1` is how an operator sees where a request that never answers waits: the
    dump names the engine's thread at work, and the stream and the daemon go on."""
    daemon = start_daemon(env=run_env(tmp_path))
    stream = Stream(client(daemon), max_tokens=48)
    stream.wait_started()
    dump = daemon.stacks_and_log(lines=100_000)
    assert "Thread 0x" in dump and "most recent call first" in dump
    assert "vllm_mlx/engine/scheduler.py" in dump  # the engine thread, mid-request
    stream.wait()
    assert stream.error is None and stream.completion_tokens == 48
    assert get(daemon, "/health") == 200 and daemon.process.poll() is None


@pytest.mark.skipif(not kernel_in_use(), reason="the default model is not on the CPU kernel here")
def test_sighup_applies_the_kernel_pool_setting(start_daemon: StartDaemon, tmp_path: Path) -> None:
    model = {"name": "first", "source": BUILTIN}
    daemon = start_daemon(
        {"models": [model], "engine": {"kernel_pool": "eager"}}, env=run_env(tmp_path)
    )
    named = {"policy": "eager", "chosen_by": "engine.kernel_pool", "ms_a_step": None}
    assert status(daemon)["kernel_pool"] == named  # applied as named, nothing measured
    edit_config(daemon, {"engine": {"kernel_pool": "auto"}})
    poll(
        lambda: status(daemon)["config"]["pending_changes"] == ["engine.kernel_pool (model)"],
        "the pool change to be pending (it applies when models load)",
    )
    assert status(daemon)["kernel_pool"] == named
    daemon.process.send_signal(signal.SIGHUP)
    poll(lambda: status(daemon)["kernel_pool"]["chosen_by"] == "measured", "the measurement")
    measured = status(daemon)["kernel_pool"]
    assert measured["policy"] in ("conservative", "eager")
    assert sorted(measured["ms_a_step"]) == ["conservative", "eager"]
    assert status(daemon)["config"]["pending_changes"] == []
