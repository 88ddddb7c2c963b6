"""OpenBLAS's kernel choice: steered off its SSE3 fallback on a CPU newer than the library,
left alone everywhere else (vllm_mlx/models/cpu/openblas_core.py)."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_mlx.models.cpu import blas, openblas_core

ZEN4 = frozenset({"fma", "avx2", *openblas_core.AVX512, "avx512_bf16", "avx512_vnni"})
SKYLAKE_SERVER = frozenset({"fma", "avx2", *openblas_core.AVX512})
HASWELL = frozenset({"fma", "avx2", "avx", "sse4_2"})
OLD = frozenset({"sse4_2", "avx"})  # Sandy Bridge: AVX, no FMA


def openblas_loadable() -> bool:
    try:
        ctypes.CDLL(blas.CANDIDATES[0])
    except OSError:
        return False
    return sys.platform == "linux" and platform.machine() == "x86_64"


@pytest.fixture
def x86(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    monkeypatch.delenv(openblas_core.VARIABLE, raising=False)


@pytest.mark.parametrize(
    ("flags", "core"),
    [(ZEN4, "Cooperlake"), (SKYLAKE_SERVER, "SkylakeX"), (HASWELL, "Haswell"), (OLD, None)],
)
def test_the_best_core_follows_the_flags(flags: frozenset[str], core: str | None) -> None:
    assert openblas_core.best_core(flags) == core


def test_flags_come_from_the_first_processor(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx2 fma\n\nprocessor\t: 1\nflags\t: sse\n")
    assert openblas_core.cpu_flags(cpuinfo) == {"fpu", "avx2", "fma"}
    assert openblas_core.cpu_flags(tmp_path / "missing") == frozenset()


@pytest.mark.usefixtures("x86")
def test_a_misdetected_cpu_gets_its_best_core() -> None:
    asked: list[str] = []

    def ask(library: str) -> str:
        asked.append(library)
        return "Prescott"

    try:
        steering = openblas_core.steer("libopenblas.so.0", ZEN4, ask)
        assert os.environ[openblas_core.VARIABLE] == "Cooperlake"
    finally:
        os.environ.pop(openblas_core.VARIABLE, None)
    assert asked == ["libopenblas.so.0"]
    assert steering == openblas_core.Steering("Prescott", "Cooperlake")
    note = steering.describe()
    assert note is not None and "OPENBLAS_CORETYPE=Cooperlake" in note and "Prescott" in note


@pytest.mark.usefixtures("x86")
@pytest.mark.parametrize("detected", ["Haswell", "Zen", "SkylakeX", "Cooperlake", None])
def test_a_core_with_fma_or_an_unanswered_probe_is_left_alone(detected: str | None) -> None:
    steering = openblas_core.steer("libopenblas.so.0", ZEN4, lambda _: detected)
    assert steering.chosen is None and steering.describe() is None
    assert openblas_core.VARIABLE not in os.environ


@pytest.mark.usefixtures("x86")
def test_a_cpu_without_fma_is_never_probed() -> None:
    steering = openblas_core.steer("libopenblas.so.0", OLD, pytest.fail)
    assert steering == openblas_core.Steering(None, None)


def test_a_users_coretype_is_never_touched(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    monkeypatch.setenv(openblas_core.VARIABLE, "Haswell")
    steering = openblas_core.steer("libopenblas.so.0", ZEN4, pytest.fail)
    assert steering.chosen is None and os.environ[openblas_core.VARIABLE] == "Haswell"


def test_other_machines_are_never_probed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    monkeypatch.delenv(openblas_core.VARIABLE, raising=False)
    assert openblas_core.steer("libopenblas.so.0", ZEN4, pytest.fail).chosen is None


def test_a_library_that_cannot_be_asked_gives_no_answer() -> None:
    assert openblas_core.probe("libvllm-mlx-no-such-blas.so.0") is None
    assert openblas_core.probe(ctypes.util.find_library("m") or "libm.so.6") is None


def run_configure(**env: str) -> list[str]:
    """blas.configure('auto') in a fresh process: its core, and the core OpenBLAS runs."""
    code = (
        "import ctypes\n"
        "from vllm_mlx.models.cpu import blas\n"
        "choice = blas.configure('auto')\n"
        "lib = ctypes.CDLL('libopenblas.so.0')\n"
        "lib.openblas_get_corename.restype = ctypes.c_char_p\n"
        "print(choice.name, choice.core, lib.openblas_get_corename().decode())\n"
        "print(choice.reason)\n"
    )
    base = {k: v for k, v in os.environ.items() if k != openblas_core.VARIABLE}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
        env={**base, **env}, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.splitlines()


@pytest.mark.skipif(not openblas_loadable(), reason="OpenBLAS on Linux x86-64 only")
def test_the_loaded_library_runs_kernels_with_this_cpus_fma() -> None:
    # On a CPU the installed OpenBLAS does not know (Debian 12's 0.3.21 on an Intel Xeon
    # of model 207) this is the steering at work; on one it knows, its own choice.
    (summary, reason) = run_configure()
    name, core, running = summary.split()
    assert name == "openblas" and core == running and f"OpenBLAS core {core}" in reason
    if openblas_core.best_core(openblas_core.cpu_flags()) is not None:
        assert running.lower() not in openblas_core.WITHOUT_FMA, reason
    detected = openblas_core.probe(blas.CANDIDATES[0])
    assert (detected == running) == ("OPENBLAS_CORETYPE" not in reason), (detected, reason)


@pytest.mark.skipif(not openblas_loadable(), reason="OpenBLAS on Linux x86-64 only")
def test_the_loaded_library_keeps_a_users_core() -> None:
    (summary, reason) = run_configure(OPENBLAS_CORETYPE="Prescott")
    assert summary.split()[1:] == ["Prescott", "Prescott"] and "set:" not in reason
