"""An independent numpy reference for a llama GGUF: raw file reader plus forward pass.

It shares nothing with the importer under test: it parses the GGUF bytes itself (not
``mx.load``), dequantizes Q4_1/Q8_0 blocks by llama.cpp's definitions, keeps attn_q/attn_k
in llama.cpp's permuted row order and applies llama.cpp's own RoPE convention (rotating
adjacent pairs) to them. If the importer's unpermutation, renaming or quantization
metadata were wrong, its logits would disagree with these.
"""

from __future__ import annotations

import pathlib
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

F32 = npt.NDArray[np.float32]

_GGML_F32, _GGML_F16, _GGML_Q4_1, _GGML_Q8_0 = 0, 1, 3, 8
# Bytes per 32-weight block: Q4_1 = fp16 scale + fp16 min + 16 bytes of nibbles;
# Q8_0 = fp16 scale + 32 int8.
_BLOCK_BYTES = {_GGML_Q4_1: 20, _GGML_Q8_0: 34}
# GGUF metadata value types -> struct format (8 = string, 9 = array handled apart).
_SCALAR_FMT = dict(zip((0, 1, 2, 3, 4, 5, 6, 7, 10, 11, 12), "BbHhIif?Qqd", strict=True))


@dataclass(frozen=True)
class _TensorInfo:
    shape: tuple[int, ...]  # numpy order: rows first
    ggml_type: int
    offset: int


class GGUFFile:
    """Minimal GGUF v2/v3 reader: metadata and dequantized float32 tensors."""

    def __init__(self, path: pathlib.Path) -> None:
        self._raw = np.memmap(path, dtype=np.uint8, mode="r")
        buf = self._raw.data
        magic, version = struct.unpack_from("<4sI", buf, 0)
        if magic != b"GGUF" or version not in (2, 3):
            raise ValueError(f"not a GGUF v2/v3 file: {path}")
        n_tensors, n_kv = struct.unpack_from("<QQ", buf, 8)
        pos = 24
        self.metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key, pos = _read_str(buf, pos)
            (vtype,), pos = struct.unpack_from("<I", buf, pos), pos + 4
            self.metadata[key], pos = _read_value(buf, pos, vtype)
        self._tensors: dict[str, _TensorInfo] = {}
        for _ in range(n_tensors):
            name, pos = _read_str(buf, pos)
            (n_dims,), pos = struct.unpack_from("<I", buf, pos), pos + 4
            dims = struct.unpack_from(f"<{n_dims}Q", buf, pos)
            pos += 8 * n_dims
            ggml_type, offset = struct.unpack_from("<IQ", buf, pos)
            pos += 12
            # GGUF lists dimensions fastest-first (ne0 = columns).
            self._tensors[name] = _TensorInfo(tuple(reversed(dims)), ggml_type, offset)
        align = int(self.metadata.get("general.alignment", 32))
        self._data_start = (pos + align - 1) // align * align

    def names(self) -> list[str]:
        return list(self._tensors)

    def tensor(self, name: str) -> F32:
        info = self._tensors[name]
        count = int(np.prod(info.shape))
        start = self._data_start + info.offset
        if info.ggml_type == _GGML_F32:
            floats: F32 = self._raw[start : start + 4 * count].view(np.float32)
            return floats.reshape(info.shape)
        if info.ggml_type == _GGML_F16:
            data = self._raw[start : start + 2 * count].view(np.float16)
            return data.astype(np.float32).reshape(info.shape)
        blocks = self._raw[start : start + count // 32 * _BLOCK_BYTES[info.ggml_type]]
        blocks = blocks.reshape(-1, _BLOCK_BYTES[info.ggml_type])
        scale = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)
        if info.ggml_type == _GGML_Q8_0:
            quants = blocks[:, 2:34].copy().view(np.int8).astype(np.float32)
            values = scale * quants
        elif info.ggml_type == _GGML_Q4_1:
            low = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
            nibbles = blocks[:, 4:20]
            # A block's first 16 weights sit in the low nibbles, the last 16 in the high.
            quants = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=1).astype(np.float32)
            values = scale * quants + low
        else:
            raise ValueError(f"reference reader lacks ggml type {info.ggml_type} ({name})")
        return values.reshape(info.shape)


def _read_str(buf: memoryview, pos: int) -> tuple[str, int]:
    (length,) = struct.unpack_from("<Q", buf, pos)
    start = pos + 8
    return bytes(buf[start : start + length]).decode("utf-8"), start + length


def _read_value(buf: memoryview, pos: int, vtype: int) -> tuple[Any, int]:
    if vtype == 8:
        return _read_str(buf, pos)
    if vtype == 9:
        elem_type, count = struct.unpack_from("<IQ", buf, pos)
        pos += 12
        items = []
        for _ in range(count):
            item, pos = _read_value(buf, pos, elem_type)
            items.append(item)
        return items, pos
    fmt = _SCALAR_FMT[vtype]
    return struct.unpack_from("<" + fmt, buf, pos)[0], pos + struct.calcsize(fmt)


def _rms_norm(x: F32, weight: F32, eps: float) -> F32:
    scale = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    normed: F32 = (x * scale * weight).astype(np.float32)
    return normed


def _rope_adjacent_pairs(x: F32, base: float) -> F32:
    """llama.cpp's LLAMA_ROPE_TYPE_NORM: rotate (x[2i], x[2i+1]) by pos * base^(-2i/D)."""
    seq, _, dim = x.shape
    inv_freq = base ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)
    angles = np.arange(seq, dtype=np.float64)[:, None] * inv_freq[None, :]
    cos = np.cos(angles)[:, None, :].astype(np.float32)
    sin = np.sin(angles)[:, None, :].astype(np.float32)
    even, odd = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = even * cos - odd * sin
    out[..., 1::2] = even * sin + odd * cos
    return out


def reference_logits(gguf: GGUFFile, token_ids: list[int]) -> F32:
    """Logits of shape (len(token_ids), vocab) for a llama GGUF, computed in float32."""
    md = gguf.metadata
    n_head = int(md["llama.attention.head_count"])
    n_kv = int(md["llama.attention.head_count_kv"])
    eps = float(md["llama.attention.layer_norm_rms_epsilon"])
    base = float(md["llama.rope.freq_base"])
    embed = gguf.tensor("token_embd.weight")
    x = embed[np.asarray(token_ids)]
    seq, hidden = x.shape
    head_dim = hidden // n_head
    causal = np.triu(np.full((seq, seq), -np.inf, dtype=np.float32), k=1)

    for layer in range(int(md["llama.block_count"])):

        def w(name: str, layer: int = layer) -> F32:
            return gguf.tensor(f"blk.{layer}.{name}.weight")

        h = _rms_norm(x, w("attn_norm"), eps)
        q = _rope_adjacent_pairs((h @ w("attn_q").T).reshape(seq, n_head, head_dim), base)
        k = _rope_adjacent_pairs((h @ w("attn_k").T).reshape(seq, n_kv, head_dim), base)
        v = (h @ w("attn_v").T).reshape(seq, n_kv, head_dim)
        group = n_head // n_kv
        k = np.repeat(k, group, axis=1)
        v = np.repeat(v, group, axis=1)
        scores = np.einsum("qhd,khd->hqk", q, k) / np.float32(np.sqrt(head_dim)) + causal
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        probs = scores / scores.sum(axis=-1, keepdims=True)
        attn = np.einsum("hqk,khd->qhd", probs, v).reshape(seq, hidden)
        x = x + attn @ w("attn_output").T

        h = _rms_norm(x, w("ffn_norm"), eps)
        gate = h @ w("ffn_gate").T
        up = h @ w("ffn_up").T
        x = x + (gate / (1.0 + np.exp(-gate)) * up) @ w("ffn_down").T

    x = _rms_norm(x, gguf.tensor("output_norm.weight"), eps)
    head = gguf.tensor("output.weight") if "output.weight" in gguf.names() else embed
    return (x @ head.T).astype(np.float32)
