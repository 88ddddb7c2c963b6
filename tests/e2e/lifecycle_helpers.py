"""Helpers for the lifecycle tests: editing the daemon's file, polling, background streams."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import yaml

from tests.conftest import DaemonProcess, deep_merge

DEADLINE_S = 60.0  # generous: the CPU is shared; the reload itself is ~0.1 s


def run_env(tmp_path: Path) -> dict[str, str]:
    """Keep this test's pid files apart from other daemons on the machine."""
    return {"XDG_RUNTIME_DIR": str(tmp_path / "run")}


def pid_file(tmp_path: Path, port: int) -> Path:
    return tmp_path / "run" / "vllm-mlx" / f"vllm-mlx-{port}.pid"


def write_like_an_editor(path: Path, text: str) -> None:
    """Save as vim/VS Code do: a new file renamed over the old one."""
    temp = path.with_name(f".{path.name}.swp")
    temp.write_text(text)
    os.replace(temp, path)


def edit_config(daemon: DaemonProcess, changes: dict[str, Any]) -> None:
    data = yaml.safe_load(daemon.config_path.read_text())
    write_like_an_editor(daemon.config_path, yaml.safe_dump(deep_merge(data, changes)))


def poll(condition: Callable[[], bool], what: str, deadline_s: float = DEADLINE_S) -> None:
    """Wait for a condition (never a fixed sleep as synchronisation)."""
    deadline = time.monotonic() + deadline_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {deadline_s}s waiting for {what}")
        time.sleep(0.05)


def get(daemon: DaemonProcess, path: str, key: str | None = None, port: int | None = None) -> int:
    """Status code of GET path (0 when nothing listens)."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    url = f"http://127.0.0.1:{port or daemon.port}{path}"
    try:
        return httpx.get(url, headers=headers, timeout=10).status_code
    except httpx.TransportError:
        return 0


def status(daemon: DaemonProcess, key: str | None = None) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    response = httpx.get(f"{daemon.base_url}/v1/status", headers=headers, timeout=10)
    response.raise_for_status()
    body: dict[str, Any] = response.json()
    return body


def client(daemon: DaemonProcess, key: str = "unused", port: int | None = None) -> openai.OpenAI:
    base = f"http://127.0.0.1:{port or daemon.port}/v1"
    return openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=120)


# SmolLM2's end tokens (<|endoftext|>, <|im_end|>), banned so that a stream runs to
# max_tokens: a test can then rely on it still running while the daemon reloads.
NO_EOS = {"0": -100, "2": -100}


class Stream:
    """A streamed chat completion running on its own thread, to exactly max_tokens."""

    def __init__(self, api: openai.OpenAI, model: str = "default", max_tokens: int = 24) -> None:
        self.api, self.model, self.max_tokens = api, model, max_tokens
        self.text = ""
        self.chunks = 0
        self.finish_reason: str | None = None
        self.completion_tokens: int | None = None
        self.error: BaseException | None = None
        self.first_chunk = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            stream = self.api.chat.completions.create(
                model=self.model,
                messages=[{"role": "user", "content": "Write a long story about a dragon."}],
                max_tokens=self.max_tokens,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
                logit_bias=NO_EOS,
            )
            for chunk in stream:
                self.chunks += 1
                self.first_chunk.set()
                if chunk.usage is not None:
                    self.completion_tokens = chunk.usage.completion_tokens
                for choice in chunk.choices:
                    self.text += choice.delta.content or ""
                    self.finish_reason = choice.finish_reason or self.finish_reason
        except BaseException as exc:
            self.error = exc
        finally:
            self.first_chunk.set()

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def wait_started(self) -> None:
        assert self.first_chunk.wait(DEADLINE_S * 2), "the stream never started"
        assert self.error is None, self.error

    def wait(self) -> None:
        self._thread.join(DEADLINE_S * 4)
        assert self.done, "the stream did not end"


def vllm_mlx(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the CLI as an operator would."""
    return subprocess.run(
        [sys.executable, "-m", "vllm_mlx.cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=120,
        check=False,
    )


def listening_lines(daemon: DaemonProcess) -> int:
    return sum(1 for line in daemon.log_text().splitlines() if '"event": "listening"' in line)
