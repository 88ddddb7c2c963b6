"""The kernel's C++ core on its own, per instruction set: tests/native/qmm_selftest.cpp
against a double-precision reference for bits 4/8, group sizes 32/64/128, several row
counts, f32/f16/bf16 scales and threads 1/2.

Natively it covers every set this CPU has (scalar, AVX2, AVX-512 here). The NEON tiles
(arm64 Linux) cannot run on this x86-64 machine: they are cross-compiled and run under
qemu-aarch64's user-mode emulation, which executes the real arm64 instructions.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ROOT / "daemon" / "vllm_mlx" / "kernels"
SOURCES = [
    ROOT / "tests" / "native" / "qmm_selftest.cpp",
    *(KERNELS / name for name in ("qmm_kernel.cpp", "qmm_avx2.cpp", "qmm_avx512.cpp")),
    *(KERNELS / name for name in ("qmm_vnni.cpp", "qmm_int8.cpp", "qmm_int8_avx2.cpp")),
    *(KERNELS / name for name in ("qmm_neon.cpp", "thread_pool.cpp")),
    # The activation and attention kernels use no MLX headers: built here too, so an arm64
    # build of the whole extension is known to compile (their numerics are tested on x86).
    *(KERNELS / name for name in ("act_kernel.cpp", "attn_kernel.cpp", "attn_prefill.cpp")),
    *(KERNELS / name for name in ("attn_prefill_avx2.cpp", "attn_prefill_avx512.cpp")),
    *(KERNELS / name for name in ("attn_decode_avx2.cpp", "attn_decode_avx512.cpp")),
]


def _build(compiler: str, out: Path, *flags: str) -> Path:
    """Each source compiled on its own, as many at once as there are cores (one g++ over
    all of them took ~28 s of CI on a 2-core CPU, ~15 s this way), then linked."""
    command = [
        compiler,
        "-O2",
        "-ffp-contract=off",
        "-std=c++20",
        "-pthread",
        f"-I{KERNELS}",
        *flags,
    ]
    objects = [out.parent / f"{out.name}-{source.stem}.o" for source in SOURCES]

    def compile_one(source: Path, obj: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*command, "-c", str(source), "-o", str(obj)], capture_output=True, text=True
        )

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        for done in pool.map(compile_one, SOURCES, objects):
            assert done.returncode == 0, done.stderr[-4000:]
    done = subprocess.run(
        [*command, *map(str, objects), "-o", str(out)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return out


def _run(*command: str) -> list[str]:
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.splitlines()


@pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler")
def test_every_native_instruction_set_matches_the_reference(tmp_path: Path) -> None:
    lines = _run(str(_build("g++", tmp_path / "selftest")))
    isas = [line.split()[1] for line in lines]
    assert "isa=scalar" in isas
    if platform.machine() == "x86_64":
        assert "isa=avx2" in isas  # every x86-64 CI machine of ours has it
    assert all(line.startswith("ok ") for line in lines)


@pytest.mark.skipif(
    platform.machine() != "x86_64"
    or shutil.which("aarch64-linux-gnu-g++") is None
    or shutil.which("qemu-aarch64") is None,
    reason="needs x86-64 with g++-aarch64-linux-gnu and qemu-user (install.sh --dev)",
)
def test_neon_tiles_match_the_reference_under_qemu(tmp_path: Path) -> None:
    binary = _build("aarch64-linux-gnu-g++", tmp_path / "selftest-arm64", "-static")
    lines = _run("qemu-aarch64", str(binary))
    assert [line.split()[1] for line in lines] == ["isa=scalar", "isa=neon"]
    assert all(line.startswith("ok ") for line in lines)
