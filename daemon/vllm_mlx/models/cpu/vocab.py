"""Whole-vocabulary row operations through the extension on the CPU: normalizing logits
and drawing a token.

Every sampled row is normalized every step (`logits - logsumexp(logits)`), and on Linux
x86-64 MLX's CPU `exp` runs one float at a time with a library call per fma: 0.68 ms per
row of a 49k-token vocabulary, 9.6 ms for 16 rows, a tenth of a 16-stream decode step.
The extension's `logsumexp` (kernels/logsumexp.h) gives the same bits, the exponentials
vectorised: 0.14 ms and 1.4 ms (docs/benchmarks.md, "Round 7"). Same bits means nothing
else changes: tokens, logprobs and seeded samples are those of `mx.logsumexp`.

Drawing: `mx.random.categorical` (Gumbel-max) takes a uniform number per vocabulary entry
and two logarithms of each, 0.83 ms a row here. `categorical` inverts the cumulative
softmax at one uniform number per row (kernels/logsumexp.h): the same distribution, 0.18
ms a row. The token a given seed draws differs from Gumbel-max's, so a seed gives other
(equally likely) text than in versions before this one; it still repeats exactly.

Used on x86-64 CPUs with the built kernel and for float32 logits; elsewhere (arm64, whose
MLX sums several lanes at a time, so the bits would differ; a GPU; other dtypes) the MLX
operations.
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


def categorical(logits: mx.array, key: mx.array) -> mx.array:
    """One token index per row of `logits` (already scaled by 1 / temperature), drawn from
    softmax(logits) with `key`."""
    if logits.dtype == mx.float32 and _kernel_serves():
        uniform = mx.random.uniform(shape=logits.shape[:-1], key=key)
        token: mx.array = qmm.extension().categorical_draw(logits, uniform)
        return token
    return mx.random.categorical(logits, key=key)
