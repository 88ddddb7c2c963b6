"""Shared fixtures: a real daemon process started from a YAML file on a free port."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.support.replay import launcher as replay_launcher
from tests.support.replay import split_replays

STARTUP_TIMEOUT_S = 120.0
# pytest-xdist workers for `-n auto` (pyproject's default): one per core this process may
# use, at most four. Each worker's daemons and engines use every core for the model, so
# more workers than cores only queue, and each holds its own models in memory.
MAX_WORKERS = 4


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    affinity = getattr(os, "sched_getaffinity", None)  # Linux; macOS has none
    cores = len(affinity(0)) if affinity is not None else (os.cpu_count() or 1)
    return max(1, min(cores, MAX_WORKERS))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(eq=False)
class DaemonProcess:
    process: subprocess.Popen[bytes]
    port: int
    config_path: Path
    log_path: Path
    api_key: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stacks_and_log(self, lines: int = 120, timeout: float = 10.0) -> str:
        """The log's last `lines` after asking a live daemon for its threads' stacks
        (SIGUSR1), for the report of a test that failed while it ran."""
        if self.process.poll() is None:
            before = self.log_path.stat().st_size
            self.process.send_signal(signal.SIGUSR1)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:  # until the dump has reached the file
                with self.log_path.open("rb") as log:
                    log.seek(before)
                    if b"most recent call first" in log.read():
                        break
                time.sleep(0.05)
        return "\n".join(self.log_text().splitlines()[-lines:]) + self.native_stacks()

    def native_stacks(self) -> str:
        """Every thread's native stack (gdb, where installed and allowed to attach): where
        a computation waits below Python, in MLX or the kernel's pool."""
        gdb = shutil.which("gdb")
        if gdb is None or self.process.poll() is not None:
            return ""
        pid = str(self.process.pid)
        command = [gdb, "-p", pid, "-batch", "-nx", "-ex", "thread apply all bt 30"]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
        except subprocess.TimeoutExpired:
            return "\n(gdb did not finish in 60 s)"
        return "\n\nnative stacks (gdb):\n" + done.stdout[-60_000:]

    def wait_healthy(self, timeout: float = STARTUP_TIMEOUT_S) -> None:
        """Poll /health until 200 (a readiness condition, not a fixed sleep)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"daemon exited with {self.process.returncode}:\n{self.log_text()}"
                )
            try:
                if httpx.get(f"{self.base_url}/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"daemon not healthy after {timeout}s:\n{self.log_text()}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        if self in LIVE_DAEMONS:
            LIVE_DAEMONS.remove(self)
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


# This worker's daemons not yet stopped: a failing test's report carries their logs.
LIVE_DAEMONS: list[DaemonProcess] = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A test that failed while daemons ran (a request that never answered, a wrong
    reply) gets each one's log tail and thread stacks in its report: the daemon's side
    of the failure, which its temporary directory loses once the run is over."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.failed and call.when == "call":
        for daemon in list(LIVE_DAEMONS):
            title = f"daemon on port {daemon.port}: log tail and thread stacks"
            report.sections.append((title, daemon.stacks_and_log()))


@pytest.fixture(scope="session")
def model_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One GGUF import per test session, shared by every daemon."""
    return tmp_path_factory.mktemp("model-cache")


def base_config(port: int, cache_dir: Path, state_dir: Path) -> dict[str, Any]:
    return {
        "server": {"host": "127.0.0.1", "port": port},
        # Each daemon its own usage database unless a test names one (restarts do).
        "paths": {"cache_dir": str(cache_dir), "state_dir": str(state_dir)},
        "logging": {"format": "json"},
        # The model cache directory is shared by every test daemon: a disk tier there
        # would let one test's prompts warm another's. The tests of the tier turn it on.
        "engine": {"disk_cache_mb": 0},
    }


def deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def launch(
    directory: Path,
    cache_dir: Path,
    config: dict[str, Any] | None = None,
    args: list[str] | None = None,
    env: dict[str, str] | None = None,
) -> DaemonProcess:
    """Write the YAML file and start `python -m vllm_mlx.cli serve --config FILE` (through
    tests/support/replay_daemon.py when a model has a test-only `replay:` source)."""
    port = free_port()
    base = base_config(port, cache_dir, directory / f"state-{port}")
    settings, replays = split_replays(deep_merge(base, config or {}))
    config_path = directory / f"vllm-mlx-{port}.yaml"
    config_path.write_text(yaml.safe_dump(settings, sort_keys=False))
    log_path = directory / f"daemon-{port}.log"
    process_env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
    process_env.pop("VLLM_MLX_CONFIG", None)
    daemon = [sys.executable, "-m", "vllm_mlx.cli"]
    if replays:  # the fake in front of the real CLI
        daemon, process_env = replay_launcher(replays, process_env)
    command = [*daemon, "serve", "--config", str(config_path)]
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            [*command, *(args or [])], stdout=log_file, stderr=subprocess.STDOUT, env=process_env
        )
    daemon_process = DaemonProcess(process, port, config_path, log_path)
    LIVE_DAEMONS.append(daemon_process)
    return daemon_process


@contextlib.contextmanager
def running(
    directory: Path,
    cache_dir: Path,
    config: dict[str, Any] | None = None,
    args: list[str] | None = None,
) -> Iterator[DaemonProcess]:
    """A healthy daemon for the block (module fixtures share one this way), then stopped."""
    daemon = launch(directory, cache_dir, config, args)
    try:
        daemon.wait_healthy()
        yield daemon
    finally:
        daemon.stop()


StartDaemon = Callable[..., DaemonProcess]


@pytest.fixture
def start_daemon(tmp_path: Path, model_cache_dir: Path) -> Iterator[StartDaemon]:
    """Start daemons from YAML settings (merged over a test base); all stopped after the test."""
    started: list[DaemonProcess] = []

    def start(
        config: dict[str, Any] | None = None,
        *,
        wait: bool = True,
        args: list[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> DaemonProcess:
        daemon = launch(tmp_path, model_cache_dir, config, args, env)
        started.append(daemon)
        if wait:
            daemon.wait_healthy()
        return daemon

    yield start
    for daemon in started:
        daemon.stop()


@pytest.fixture(scope="module")
def shared_daemon(
    tmp_path_factory: pytest.TempPathFactory, model_cache_dir: Path
) -> Iterator[DaemonProcess]:
    """One daemon with the default config for a whole test module (tests that change nothing)."""
    with running(tmp_path_factory.mktemp("shared-daemon"), model_cache_dir) as daemon:
        yield daemon
