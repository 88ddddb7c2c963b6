"""Servers the harness starts on loopback: vllm-mlx (this repo) and its peers.

Every peer serves the same model: vllm-mlx and mlx_lm.server load the same mlx-lm
directory (`vllm-mlx models --json`), llama-server loads the bundled GGUF it came from.
Optional peers that are not installed are reported as skipped, never faked.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

REPO = Path(__file__).resolve().parent.parent
STARTUP_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class PeerSpec:
    """How to start one server; `skip` says why it cannot run here."""

    name: str
    label: str  # what the report calls it, with weights and BLAS
    command: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    model_id: str = "default"
    port: int = 0
    skip: str | None = None
    api_key: str | None = None  # sent by the readiness probe when the server wants one

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def parse_models_json(text: str) -> list[dict[str, Any]]:
    """`vllm-mlx models --json` output; tolerates log lines printed before the JSON."""
    start = text.find("\n[")
    start = 0 if text.startswith("[") else start + 1
    if start <= 0 and not text.startswith("["):
        raise ValueError(f"no JSON list in `vllm-mlx models --json` output: {text[:200]!r}")
    rows: list[dict[str, Any]] = json.loads(text[start:])
    return rows


def model_directory(config: str | None = None) -> Path:
    """The first configured model's local mlx-lm directory, as `vllm-mlx models` resolves it."""
    command = [sys.executable, "-m", "vllm_mlx.cli", "models", "--json"]
    if config:
        command += ["--config", config]
    out = subprocess.run(command, capture_output=True, text=True, check=True, timeout=600)
    directory = parse_models_json(out.stdout)[0]["directory"]
    if not directory:
        raise RuntimeError(
            "the first configured model is not downloaded; run `vllm-mlx models --resolve`"
        )
    return Path(directory)


def float32_directory(model_dir: Path, cache: Path) -> Path:
    """A dequantized float32 copy of model_dir (mlx_lm.convert), made once."""
    out = cache / f"{model_dir.name}-float32"
    if (out / "config.json").is_file():
        return out
    cache.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "mlx_lm", "convert", "--hf-path", str(model_dir),
         "--mlx-path", str(out), "--dequantize", "--dtype", "float32"],
        check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    return out


def vllm_mlx_spec(
    work: Path,
    model_dir: Path,
    label: str,
    engine: dict[str, Any] | None = None,
    model: dict[str, Any] | None = None,
    python: str = sys.executable,
    paths: dict[str, Any] | None = None,
    sections: dict[str, Any] | None = None,
) -> PeerSpec:
    """This repo's daemon on model_dir with the default settings (plus `engine`, `model`,
    other top-level `sections`); `python`: another checkout's interpreter (its venv) to
    measure a baseline build."""
    port = free_port()
    config = {
        "server": {"host": "127.0.0.1", "port": port},
        "models": [
            {"name": "bench", "source": str(model_dir), "aliases": ["default"], **(model or {})}
        ],
        "engine": engine or {},
        "logging": {"level": "warning", "format": "json"},
        **({"paths": paths} if paths else {}),
        **(sections or {}),
    }
    path = work / f"vllm-mlx-{port}.yaml"
    path.write_text(yaml.safe_dump(config))
    command = (python, "-m", "vllm_mlx.cli", "serve", "--config", str(path))
    return PeerSpec("vllm-mlx", label, command, model_id="bench", port=port)


def mlx_lm_spec(model_dir: Path, label: str, preload: str | None) -> PeerSpec:
    port = free_port()
    command = (
        sys.executable, "-m", "mlx_lm.server", "--model", str(model_dir),
        "--port", str(port), "--log-level", "WARNING",
    )  # fmt: skip
    # LD_PRELOAD gives mlx_lm.server the same BLAS the daemon loads for itself.
    env = {"LD_PRELOAD": preload} if preload else {}
    return PeerSpec("mlx_lm.server", label, command, env, model_id=str(model_dir), port=port)


def llama_server_spec(
    binary: str | None, gguf: Path, slots: int, threads: int, context_per_slot: int = 3072
) -> PeerSpec:
    found = binary or shutil.which("llama-server")
    label = f"llama-server ({gguf.name}, -np {slots} -t {threads})"
    if not found or not Path(found).exists():
        return PeerSpec("llama-server", label, skip="llama-server not on PATH (--llama-server)")
    port = free_port()
    command = (
        found, "-m", str(gguf), "--port", str(port), "--host", "127.0.0.1",
        "-np", str(slots), "-t", str(threads), "-c", str(slots * context_per_slot),
        "--no-webui",
    )  # fmt: skip
    return PeerSpec("llama-server", label, command, port=port)


def pip_vllm_mlx_spec(venv: str | None, model_dir: Path) -> PeerSpec:
    label = "vllm-mlx (PyPI package)"
    binary = Path(venv) / "bin" / "vllm-mlx" if venv else None
    if binary is None or not binary.exists():
        return PeerSpec("vllm-mlx-pypi", label, skip="no venv given (--pip-vllm-mlx VENV)")
    port = free_port()
    command = (str(binary), "serve", str(model_dir), "--port", str(port), "--continuous-batching")
    return PeerSpec("vllm-mlx-pypi", label, command, model_id=str(model_dir), port=port)


def _ready(spec: PeerSpec) -> bool:
    """Ready = a one-token chat completion succeeds (a listening server may still be loading)."""
    body = {
        "model": spec.model_id,
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 1,
    }
    headers = {"Authorization": f"Bearer {spec.api_key}"} if spec.api_key else {}
    try:
        reply = httpx.post(
            f"{spec.base_url}/v1/chat/completions", json=body, headers=headers, timeout=60
        )
    except httpx.HTTPError:
        return False
    return reply.status_code == 200


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL if it is still there after 30 s."""
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@contextmanager
def running(spec: PeerSpec, log_path: Path) -> Iterator[PeerSpec]:
    """Start the server, wait until it generates, stop it (SIGTERM, then SIGKILL)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **spec.env}
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            spec.command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO
        )
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not _ready(spec):
            if process.poll() is not None or time.monotonic() > deadline:
                tail = log_path.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{spec.name} did not start:\n{tail}")
            time.sleep(0.5)  # polling a readiness condition, not synchronising on time
        yield spec
    finally:
        stop(process)
