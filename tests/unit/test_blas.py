"""BLAS choice: the policy in-process, the real library binding in a fresh process."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import pytest

from vllm_mlx.models.cpu import blas


def openblas_installed() -> bool:
    try:
        ctypes.CDLL(blas.CANDIDATES[0])
    except OSError:
        return False
    return True


def run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )


def test_macos_keeps_accelerate_and_loads_nothing() -> None:
    choice = blas._choose("auto", "darwin")
    assert choice.name == "accelerate" and choice.path is None and choice.optimized


def test_bundled_mode_loads_nothing() -> None:
    choice = blas._choose("bundled", "linux")
    assert choice.name == "bundled" and not choice.optimized


def test_too_late_once_mlx_is_imported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mlx.core", object())
    choice = blas._choose("auto", "linux")
    assert not choice.optimized and "imported before" in choice.reason


def test_auto_without_openblas_falls_back_with_a_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "mlx.core", raising=False)
    monkeypatch.setattr(blas, "CANDIDATES", ("libvllm-mlx-no-such-blas.so.0",))
    choice = blas._choose("auto", "linux")
    assert choice.name == "bundled" and "apt-get install libopenblas0-pthread" in choice.reason


def test_an_explicit_path_that_cannot_load_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "mlx.core", raising=False)
    with pytest.raises(ValueError, match="cannot load"):
        blas._choose("/nonexistent/libblas.so.3", "linux")


def test_configure_is_idempotent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(blas, "_active", None)
    first = blas.configure("bundled")
    assert blas.configure("auto") is first and blas.active() is first


@pytest.mark.skipif(sys.platform != "linux", reason="symbol binding is checked with ld.so")
@pytest.mark.skipif(not openblas_installed(), reason="OpenBLAS is not installed")
def test_mlx_binds_its_matmul_to_openblas_when_chosen_first() -> None:
    # LD_DEBUG=bindings makes ld.so print which library each symbol is bound to: the
    # proof that MLX calls OpenBLAS rather than its bundled reference BLAS.
    code = (
        "from vllm_mlx.models.cpu import blas; c = blas.configure('auto'); print(c.name, c.path)\n"
        "import mlx.core as mx\n"
        "a = mx.ones((64, 64)); mx.eval(a @ a)\n"
    )
    done = run_python(code, LD_DEBUG="bindings")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("openblas /")
    bound = [line for line in done.stderr.splitlines() if "`cblas_sgemm'" in line]
    assert bound and all("libopenblas" in line for line in bound), bound


@pytest.mark.skipif(sys.platform != "linux", reason="symbol binding is checked with ld.so")
def test_mlx_keeps_the_bundled_blas_when_asked() -> None:
    code = (
        "from vllm_mlx.models.cpu import blas; print(blas.configure('bundled').name)\n"
        "import mlx.core as mx\n"
        "a = mx.ones((64, 64)); mx.eval(a @ a)\n"
    )
    done = run_python(code, LD_DEBUG="bindings")
    assert done.returncode == 0, done.stderr[-2000:]
    bound = [line for line in done.stderr.splitlines() if "`cblas_sgemm'" in line]
    assert bound and not any("openblas" in line for line in bound), bound


def test_serve_refuses_a_blas_path_that_cannot_load(tmp_path: os.PathLike[str]) -> None:
    config = f"{tmp_path}/vllm-mlx.yaml"
    with open(config, "w") as file:
        file.write("engine:\n  blas: /nonexistent/libblas.so.3\n")
    done = subprocess.run(
        [sys.executable, "-m", "vllm_mlx.cli", "serve", "--config", config],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    # Refused at config validation, with the file and line (check-config agrees).
    assert f"{config}:2:3: engine.blas: /nonexistent/libblas.so.3 does not exist" in done.stderr


def test_what_runs_before_the_blas_choice_does_not_import_mlx() -> None:
    # `serve` loads the config, then chooses the BLAS, then imports the runtime; bench
    # scripts import the loader first. Any of these importing mlx at module level would
    # leave every model on MLX's reference BLAS (a loader import once did, through the
    # Whisper attention module: transcription ran 10x slower).
    code = (
        "import sys\n"
        "import vllm_mlx.cli.main, vllm_mlx.config.settings, vllm_mlx.models.loader\n"
        "import vllm_mlx.models.speech, vllm_mlx.models.sources\n"
        "print('mlx.core' in sys.modules)\n"
    )
    done = run_python(code)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "False"
