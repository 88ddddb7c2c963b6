"""Log-probabilities from logits, normalized through the extension on the CPU.

Every sampled row is normalized every step (`logits - logsumexp(logits)`), and on Linux
x86-64 MLX's CPU `exp` runs one float at a time with a library call per fma: 0.68 ms per
row of a 49k-token vocabulary, 9.6 ms for 16 rows, a tenth of a 16-stream decode step.
The extension's `logsumexp` (kernels/logsumexp.h) gives the same bits, the exponentials
vectorised: 0.14 ms and 1.4 ms (docs/benchmarks.md, "Round 7"). Same bits means nothing
else changes: tokens, logprobs and seeded samples are those of `mx.logsumexp`.

Used on x86-64 CPUs with the built kernel and for float32 logits; elsewhere (arm64, whose
MLX sums several lanes at a time, so the bits would differ; a GPU; other dtypes) it is
`mx.logsumexp`.
"""

from __future__ import annotations

import functools
import platform

import mlx.core as mx

from vllm_mlx.models.cpu import qmm


@functools.cache
def _kernel_serves() -> bool:
    return platform.machine() in ("x86_64", "AMD64") and qmm.status().available


def log_probabilities(logits: mx.array) -> mx.array:
    """`logits - logsumexp(logits)` over the last axis."""
    if logits.dtype == mx.float32 and _kernel_serves():
        normalizer: mx.array = qmm.extension().logsumexp(logits)
    else:
        normalizer = mx.logsumexp(logits, axis=-1, keepdims=True)
    return logits - normalizer
