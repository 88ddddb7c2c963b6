"""OpenBLAS's kernels on a CPU newer than the library: steer it off its SSE3 fallback.

OpenBLAS built with DYNAMIC_ARCH (Debian's and Fedora's packages) picks its kernels when
it is loaded, from the CPU's model number. A CPU the library does not know falls back to
its oldest kernels: Debian 12's OpenBLAS 0.3.21 on an Intel Xeon of model 207 (AVX-512,
VNNI, BF16) runs 'Prescott' kernels, SSE3 with 4 floats a vector and no FMA. There the
daemon's prefill (dequantize, then OpenBLAS's sgemm) took 2.3-2.7x as long as with the
library's AVX-512 kernels (docs/benchmarks.md, "Round 10").

The library reads a core name from OPENBLAS_CORETYPE when it loads, and the choice is
final once it has. So before loading it, `steer` asks a short-lived process what the
library would pick here. When that is a core without FMA kernels while the CPU grants FMA
(a misdetection: every CPU with FMA has a better core), it sets OPENBLAS_CORETYPE to the
best core the CPU's flags support. A CPU the library knows keeps the library's own
choice, and a user's OPENBLAS_CORETYPE is never touched. Linux on x86-64 only: the
kernel lists a feature in /proc/cpuinfo only when the OS has enabled its registers.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

VARIABLE = "OPENBLAS_CORETYPE"

# OpenBLAS core names (lower case) whose kernels have no FMA: what an unknown CPU falls
# back to. A CPU with FMA that the library maps to one of these was misdetected.
WITHOUT_FMA = frozenset(
    {
        "katmai", "coppermine", "northwood", "prescott", "banias", "atom", "core2",
        "penryn", "dunnington", "nehalem", "sandybridge", "opteron", "opteron_sse3",
        "barcelona", "bobcat",
    }
)  # fmt: skip
AVX512 = frozenset({"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"})

# Asks the library, in a process of its own, which core it picks with no OPENBLAS_CORETYPE.
_PROBE = (
    "import ctypes, sys\n"
    "lib = ctypes.CDLL(sys.argv[1])\n"
    "lib.openblas_get_corename.restype = ctypes.c_char_p\n"
    "print(lib.openblas_get_corename().decode())\n"
)


@dataclass(frozen=True)
class Steering:
    """What `steer` did: the core the library picks by itself, and the one set (if any)."""

    detected: str | None
    chosen: str | None

    def describe(self) -> str | None:
        if self.chosen is None:
            return None
        return (
            f"{VARIABLE}={self.chosen} set: the library picked {self.detected}, "
            "whose kernels lack this CPU's FMA"
        )


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The first processor's flags (empty when they cannot be read)."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def best_core(flags: frozenset[str]) -> str | None:
    """The OpenBLAS core with the widest kernels these flags support (None: no FMA)."""
    if AVX512.issubset(flags):
        return "Cooperlake" if "avx512_bf16" in flags else "SkylakeX"
    if flags.issuperset({"avx2", "fma"}):
        return "Haswell"
    return None


def probe(library: str) -> str | None:
    """The core `library` picks here by itself (None when it cannot be asked)."""
    env = {k: v for k, v in os.environ.items() if k != VARIABLE}
    env["OPENBLAS_NUM_THREADS"] = "1"  # the probe needs no thread pool
    try:
        done = subprocess.run(
            [sys.executable, "-S", "-c", _PROBE, library],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    name = done.stdout.strip()
    return name if done.returncode == 0 and name else None


def steer(
    library: str,
    flags: frozenset[str] | None = None,
    ask: Callable[[str], str | None] = probe,
) -> Steering:
    """Set OPENBLAS_CORETYPE before `library` is loaded when it would misdetect this CPU."""
    if VARIABLE in os.environ or platform.machine().lower() not in ("x86_64", "amd64"):
        return Steering(None, None)
    best = best_core(cpu_flags() if flags is None else flags)
    if best is None:
        return Steering(None, None)
    detected = ask(library)
    if detected is None or detected.lower() not in WITHOUT_FMA:
        return Steering(detected, None)
    os.environ[VARIABLE] = best
    return Steering(detected, best)
