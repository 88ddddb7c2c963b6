"""Whisper's encoder self-attention with the extension's threaded softmax on the CPU.

mlx-whisper's `MultiHeadAttention.qkv_attention` is softmax(q k^T) v with MLX's softmax,
which on the CPU is one single-threaded scalar pass. A 30 s window is 1500 positions, so
each encoder layer of tiny.en softmaxes 6 x 1500 x 1500 scores: 0.43 s of a 0.62 s layer
here, ~70% of the encoder and most of a short clip's transcription (docs/audio.md). The
extension's `softmax_prefill` (the one prefill attention uses, models/cpu/attention.py)
does the same rows in one threaded, vectorised pass; the two BLAS products stay MLX's.

Only the encoder is routed: its attention has no mask and its scores are read by nobody
else. The decoder's (one new position a step, a causal mask, and the cross-attention
weights that word timestamps align on) stays mlx-whisper's. The sums run in another
order than MLX's softmax, so encoder outputs match to rounding, not bit for bit
(tests/engine/test_whisper_import.py compares both with CTranslate2's).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mlx.core as mx

from vllm_mlx.models.cpu import qmm

Attention = Callable[..., tuple[mx.array, Any]]


def available() -> bool:
    """The extension is built, passed its self-check, and has the op."""
    return qmm.status().available and hasattr(qmm.extension(), "softmax_prefill")


def _threaded(original: Attention, heads: int) -> Attention:
    def qkv_attention(
        q: mx.array, k: mx.array, v: mx.array, mask: mx.array | None = None
    ) -> tuple[mx.array, Any]:
        on_cpu = mx.default_device().type == mx.DeviceType.cpu
        if mask is not None or q.dtype != mx.float32 or not on_cpu:
            return original(q, k, v, mask)
        batch, positions, width = q.shape
        scale = (width // heads) ** -0.25  # on both sides, as mlx-whisper scales
        q = q.reshape(batch, positions, heads, -1).transpose(0, 2, 1, 3) * scale
        k = k.reshape(batch, k.shape[1], heads, -1).transpose(0, 2, 3, 1) * scale
        v = v.reshape(batch, v.shape[1], heads, -1).transpose(0, 2, 1, 3)
        scores = q @ k
        weights = qmm.extension().softmax_prefill(scores, positions, False)
        out = (weights @ v).transpose(0, 2, 1, 3).reshape(batch, positions, width)
        return out, scores

    return qkv_attention


def route_encoder_attention(whisper: Any) -> bool:
    """Give each encoder layer of a loaded mlx-whisper model the threaded softmax; False
    (nothing changed) when the extension cannot serve it."""
    if not available():
        return False
    for block in whisper.encoder.blocks:
        attention = block.attn
        # An instance attribute shadows the class's method for this model only; set
        # through object.__setattr__ because mlx's Module keeps arrays in its dict.
        object.__setattr__(
            attention, "qkv_attention", _threaded(attention.qkv_attention, attention.n_head)
        )
    return True
