"""npm clients for the e2e tests (Codex CLI, ollama-js): installed once per machine into
a cache directory, or the test is skipped saying why (no npm, no registry)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

NPM_TIMEOUT_S = 300


def npm_prefix(name: str) -> Path:
    """Where one package version is installed: under the user's cache, kept between runs."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "vllm-mlx-tests" / name


def npm_install(package: str, prefix: Path, installed: Path, what: str) -> None:
    """`npm install package` into prefix unless `installed` (a file it makes) exists."""
    if installed.exists():
        return
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip(f"npm is not installed, so {what} ({package}) cannot be installed")
    try:
        probe = subprocess.run(
            [npm, "view", package, "version"], capture_output=True, text=True, timeout=60
        )
    except subprocess.TimeoutExpired:
        pytest.skip(f"the npm registry did not answer within 60 s; {what} cannot be installed")
    if probe.returncode != 0:
        pytest.skip(f"the npm registry is unreachable ({probe.stderr.strip()[-200:]})")
    prefix.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [npm, "install", "--no-audit", "--no-fund", "--prefix", str(prefix), package],
        check=True,
        capture_output=True,
        timeout=NPM_TIMEOUT_S,
    )
