"""Make MLX's CPU backend use an optimized BLAS on Linux when one is installed.

The `mlx[cpu]` wheel links netlib's reference BLAS/LAPACK (`mlx_cpu.libs/libblas-*.so`),
which runs a float32 matmul at about 5 GFLOP/s on our 2-core test machine; Debian's
OpenBLAS (`libopenblas0-pthread`) runs the same matmul at about 190 GFLOP/s.

Mechanism: `libmlx.so` resolves `cblas_sgemm` & co. when it is loaded. The dynamic
linker searches the global scope (the executable, LD_PRELOAD, and every library opened
with RTLD_GLOBAL) before a library's own dependencies, so opening OpenBLAS with
RTLD_GLOBAL *before mlx is first imported* makes MLX bind to OpenBLAS instead of the
bundled netlib copy. This is what `LD_PRELOAD=libopenblas.so.0` does, without a re-exec
or an environment variable the user must set. Once mlx is imported its symbols are
bound and it is too late; `configure` then says so rather than pretending.

On macOS MLX uses Accelerate (and Metal): nothing is loaded there. Before OpenBLAS is
loaded, `openblas_core.steer` keeps a library older than the CPU off its SSE3 kernels.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from vllm_mlx.models.cpu import openblas_core

AUTO = "auto"
BUNDLED = "bundled"

# Tried in order with the system loader's search (ld.so.cache, LD_LIBRARY_PATH).
# Debian/Ubuntu: `libopenblas.so.0` is the alternatives link to the pthread (or
# openmp/serial) build; Fedora/Arch ship the same soname.
CANDIDATES = ("libopenblas.so.0", "libopenblas.so")

# check_library's test of an explicit path, run in a fresh interpreter.
_NOT_CBLAS = 3
_CHECK = (
    "import ctypes, sys\n"
    "lib = ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_LOCAL)\n"
    f"sys.exit(0 if hasattr(lib, 'cblas_sgemm') else {_NOT_CBLAS})\n"
)


@dataclass(frozen=True)
class BlasChoice:
    """What the process uses for BLAS, and why."""

    name: str  # "accelerate", "bundled", or the library loaded (e.g. "openblas")
    path: str | None  # the file loaded, when one was
    reason: str
    core: str | None = None  # OpenBLAS's kernels ("Cooperlake", "Haswell"), when it says

    @property
    def optimized(self) -> bool:
        return self.name != BUNDLED


_active: BlasChoice | None = None


def active() -> BlasChoice | None:
    """The choice `configure` made in this process (None when it was never called)."""
    return _active


def configure(mode: str = AUTO, platform: str | None = None) -> BlasChoice:
    """Load an optimized BLAS for MLX; call before the first `import mlx`.

    mode: `auto` (OpenBLAS when installed, else the bundled BLAS), `bundled` (leave
    MLX's own), or a path to a shared library exporting the CBLAS and LAPACK symbols.
    An explicit path that cannot be loaded raises ValueError; `auto` never fails.
    Idempotent: a second call returns the first call's choice.
    """
    global _active
    if _active is not None:
        return _active
    _active = _choose(mode, platform or sys.platform)
    return _active


def _choose(mode: str, platform: str) -> BlasChoice:
    if platform == "darwin":
        return BlasChoice("accelerate", None, "macOS: MLX uses Accelerate")
    if mode == BUNDLED:
        return BlasChoice(BUNDLED, None, "engine.blas is 'bundled'")
    if "mlx.core" in sys.modules:
        return BlasChoice(BUNDLED, None, "mlx was imported before the BLAS could be chosen")
    if mode != AUTO:
        return _load_explicit(mode)
    for name in CANDIDATES:
        steering = openblas_core.steer(name)
        handle = _open_global(name)
        if handle is not None:
            core = _core_name(handle)
            notes = [f"OpenBLAS core {core}"] if core else []
            notes += [note] if (note := steering.describe()) else []
            reason = f"loaded {name}" + (f" ({'; '.join(notes)})" if notes else "")
            return BlasChoice("openblas", _mapped_path(name) or name, reason, core)
    return BlasChoice(BUNDLED, None, f"no optimized BLAS found; {install_hint()}")


def check_library(mode: str, platform: str | None = None) -> None:
    """Config validation of `engine.blas`: an explicit path must be a loadable CBLAS
    library. Run by `check-config` and `serve` alike (it is a field validator), so a
    path `serve` would refuse never passes `check-config`."""
    if (platform or sys.platform) == "darwin" or mode in (AUTO, BUNDLED):
        return
    file = Path(mode).expanduser()
    if not file.is_file():
        what = "is a directory" if file.is_dir() else "does not exist"
        raise ValueError(f"{file} {what} (use auto, bundled, or a shared library's path)")
    # In a process of its own: loading it here would fix OpenBLAS's kernel choice before
    # `configure` can steer it (models/cpu/openblas_core.py).
    try:
        done = subprocess.run(
            [sys.executable, "-S", "-c", _CHECK, str(file)],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "OPENBLAS_NUM_THREADS": "1"},
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise ValueError(f"cannot load {file} as a shared library: {exc}") from exc
    if done.returncode == _NOT_CBLAS:
        raise ValueError(f"{file} is not a CBLAS library (it has no cblas_sgemm)")
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or ["it did not load"])[-1]
        raise ValueError(f"cannot load {file} as a shared library: {why}")


def _load_explicit(path: str) -> BlasChoice:
    file = Path(path).expanduser()
    steering = openblas_core.steer(str(file))
    handle = _open_global(str(file))
    if handle is None:
        raise ValueError(f"engine.blas: cannot load {file} as a shared library")
    note = steering.describe()
    reason = "engine.blas" + (f" ({note})" if note else "")
    name = file.name.split(".so")[0].removeprefix("lib")
    return BlasChoice(name, str(file), reason, _core_name(handle))


def _core_name(handle: ctypes.CDLL) -> str | None:
    """OpenBLAS's name for the kernels it runs (None for another BLAS)."""
    try:
        corename = handle.openblas_get_corename
    except AttributeError:
        return None
    corename.restype = ctypes.c_char_p
    value = corename()
    return value.decode(errors="replace") if isinstance(value, bytes) else None


def _open_global(name: str) -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
    except OSError:
        return None


def _mapped_path(name: str) -> str | None:
    """The file the loader actually mapped for `name` (it follows alternatives links)."""
    stem = name.split(".so")[0]
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    for line in maps.splitlines():
        fields = line.split()
        if len(fields) >= 6 and Path(fields[-1]).name.startswith(stem):
            return fields[-1]
    return None


def install_hint() -> str:
    return (
        "install OpenBLAS for 2-30x faster CPU inference "
        "(Debian/Ubuntu: `sudo apt-get install libopenblas0-pthread`; "
        "Fedora: `sudo dnf install openblas-threads`)"
    )
