"""The quantized CPU extension's instruction sets, for tests that run each one."""

from __future__ import annotations

from vllm_mlx.models.cpu import qmm


def isas() -> list[str]:
    """The instruction sets this CPU can run (the kernel picks the best by default)."""
    if not qmm.status().available:
        return []
    ext, found = qmm.extension(), []
    for name in ("avx512", "avx2", "scalar"):
        try:
            ext.set_isa(name)
        except ValueError:
            continue
        found.append(name)
    ext.set_isa("best")
    return found
