"""Attention through vllm_mlx/kernels' extension on the CPU: decode in one op, and prefill
fused (no score matrix in memory).

On the CPU, `mx.fast.scaled_dot_product_attention` runs MLX's fallback graph: a scale
multiply, reshapes for grouped-query attention, a `where` for the mask, a softmax and two
tiny BLAS matmuls per head, ~10 graph nodes per layer. For the bundled model at batch 1
that was ~3.5 ms of a ~17 ms decode step. The extension's `sdpa_decode` computes the same
in one node and one pass over each sequence's K and V, read in place from the cache.

A quantized KV cache (`kv_cache.bits`: K and V as MLX's affine triples of words, scales
and biases) goes to `sdpa_decode_quantized`, the same kernel reading the packed rows in
place and unpacking 64 positions at a time into a small buffer; a longer chunk to
`sdpa_prefill_quantized`, the fused prefill kernel reading them the same way. mlx_lm's
own path for it is two MLX CPU quantized matmuls (plain loops): at a 4k context a decode
step of the bundled model took 157-227 ms with it, 31-33 ms with the kernel, less than
float32 K/V's 39 ms, since a quarter (8-bit) or an eighth (4-bit) of the bytes cross the
memory bus.

A row's arithmetic never depends on its batch: a bool mask's leading excluded keys (a
batch cache's left padding) are left out of the softmax's 16 lanes, so a row gets the
bits it gets alone whatever padding its batch gives it (tests bind this, quantized too).
Nor are they read: beside a 4k-token row, a 700-token row's attention costs 700
positions, not 4,096 (tests poison the padding with NaN).

mlx_lm's model modules call `scaled_dot_product_attention` from `mlx_lm.models.base`
through their own module global, so swapping that global routes every attention layer of
the model's architecture; anything else (attention sinks, another dtype or mask) goes to
mlx_lm's original. The sums run in another order than BLAS's, so outputs match MLX's to
rounding, not bit for bit (tests/unit/test_attention_kernel.py, test_prefill_attention_
kernel.py and test_quantized_attention_kernel.py bound the error;
tests/engine/test_attention_model.py checks greedy output of the bundled model).

Prefill (several query positions): MLX's fallback materialises the (heads x queries x
keys) scores (9 x 512 x 4,096 floats, 75 MB a layer for a 512-token chunk at 4k keys),
computes the causally masked half of each block with BLAS, then scales, masks and
softmaxes them in single-threaded passes. The extension's `sdpa_prefill`
(kernels/attn_prefill.cpp) is flash-attention style: blocks of 64 queries x 64 keys, an
online softmax with MLX's exp, key blocks no query sees never computed, the query heads
of a KV head sharing its K/V reads, (sequence, KV head, query block) units over the
extension's threads; the causal limit and the batch cache's bool mask (left-padded
batches) as MLX applies them, and a query that sees no key gets MLX's uniform average of
V. For one layer of the bundled model's 512-token chunk it is ~3x faster than MLX's two
BLAS products around the extension's threaded `softmax_prefill` (what this path did
before; docs/benchmarks.md). A short chunk (up to 32 queries, half the kernel's lanes: what
prefill pacing cuts beside decoding streams) packs its query heads' rows into the lanes
and splits its keys into ranges of 256 folded at the end, so that a 4-16-token chunk
after 4k tokens reads K and V once per KV head on every thread: 1.5-2.1x the decode kernel
and the BLAS products it took before (docs/benchmarks.md, round 24). The BLAS path stays
for CPUs without AVX2 or AVX-512 (the kernel's portable loops, arm64 included, have no
register tiles).
"""

from __future__ import annotations

import sys
from typing import Any

import mlx.core as mx
from mlx_lm.models import base

from vllm_mlx.models.cpu import qmm

_ORIGINAL = base.scaled_dot_product_attention
_NAME = "scaled_dot_product_attention"
_prefill_kernel = True  # benchmarks and tests switch it to compare with MLX's fallback
_fused_prefill = True  # off: MLX's products around `softmax_prefill` (benchmarks, tests)
# A prefill chunk of at most SHORT_CHUNK_QUERIES queries (a speculative draft's check, a
# rare 2-token chunk) goes to the decode kernel, one pass over K and V in place, where the
# fused kernel takes the longer ones: from FUSED_MIN_QUERIES (its lanes packed with the
# query heads' rows) it beats the decode kernel at every context length measured; at 2
# queries they tie (docs/benchmarks.md, round 24).
FUSED_MIN_QUERIES = 3
SHORT_CHUNK_QUERIES = FUSED_MIN_QUERIES - 1
# Without the fused kernel (no register tiles: the BLAS products take the longer chunks),
# and over a quantized cache (whose packed rows the decode kernel reads in place, where
# the prefill kernels need the cache unpacked first), the decode kernel keeps chunks of up
# to 4 queries (round 14: at 6-8 the BLAS products' register tiles win).
DECODE_KERNEL_CHUNK_QUERIES = 4
# A quantized KV cache the decode kernel reads in place (MLX's affine format).
QUANTIZED_BITS = (4, 8)
QUANTIZED_GROUPS = (32, 64, 128)
# The instruction sets with the fused kernel's register tiles. Its portable loops (scalar
# x86, arm64) run at half the speed of the BLAS path on x86, and are unmeasured on arm64.
_FUSED_ISAS = ("avx512", "avx2")


def use_prefill_kernel(on: bool) -> None:
    global _prefill_kernel
    _prefill_kernel = on


def use_fused_prefill(on: bool) -> None:
    global _fused_prefill
    _fused_prefill = on


def _decodes(
    queries: mx.array, keys: mx.array, values: mx.array, cache: Any, positions: int = 1
) -> bool:
    return (
        queries.ndim == 4
        and 1 <= queries.shape[2] <= positions
        and queries.dtype == mx.float32
        and keys.dtype == mx.float32
        and values.dtype == mx.float32
        and not hasattr(cache, "bits")  # a quantized KV cache has its own path
        and mx.default_device().type == mx.DeviceType.cpu
    )


def _prefills(queries: mx.array, keys: mx.array, values: mx.array, cache: Any, mask: Any) -> bool:
    if not (
        queries.ndim == 4
        and queries.shape[2] > 1
        and queries.dtype == mx.float32
        and keys.dtype == mx.float32
        and values.dtype == mx.float32
        and not hasattr(cache, "bits")
        and mx.default_device().type == mx.DeviceType.cpu
    ):
        return False
    return _prefill_mask(mask, queries, keys.shape[2])


def _prefill_mask(mask: Any, queries: mx.array, length: int) -> bool:
    """A mask the prefill kernels take: none, causal, or bool (1 or batch, 1, M, keys)."""
    if mask is None or (isinstance(mask, str) and mask == "causal"):
        return True
    return (
        isinstance(mask, mx.array)
        and mask.dtype == mx.bool_
        and mask.ndim == 4
        and mask.shape[1] == 1
        and mask.shape[2] == queries.shape[2]
        and mask.shape[3] == length
        and mask.shape[0] in (1, queries.shape[0])
    )


def _prefill_attention(
    queries: mx.array, keys: mx.array, values: mx.array, scale: float, mask: Any
) -> mx.array:
    """softmax(scale * q k^T, causal / masked) v: the fused kernel, or for few queries MLX's
    two BLAS products (grouped heads stacked along the rows, one call per KV head, as MLX's
    fallback does) around the extension's softmax."""
    batch, q_heads, rows, dim = queries.shape
    ext = qmm.extension()
    if rows >= FUSED_MIN_QUERIES and _fused_kernel():
        if isinstance(mask, mx.array):
            fused: mx.array = ext.sdpa_prefill(queries, keys, values, scale, False, mask)
        else:
            fused = ext.sdpa_prefill(queries, keys, values, scale, mask is not None)
        return fused
    kv_heads = keys.shape[1]
    grouped = (queries * scale).reshape(batch, kv_heads, (q_heads // kv_heads) * rows, dim)
    scores = grouped @ keys.swapaxes(-1, -2)
    if isinstance(mask, mx.array):
        probs = ext.softmax_prefill(scores, rows, False, mask)
    else:
        probs = ext.softmax_prefill(scores, rows, mask is not None)
    out: mx.array = (probs @ values).reshape(batch, q_heads, rows, values.shape[-1])
    return out


def scaled_dot_product_attention(
    queries: mx.array,
    keys: mx.array,
    values: mx.array,
    cache: Any,
    scale: float,
    mask: Any,
    sinks: mx.array | None = None,
) -> mx.array:
    """mlx_lm.models.base's function, with the decode case in the extension."""
    if hasattr(cache, "bits"):  # a quantized KV cache: K and V are (words, scales, biases)
        if sinks is None and _decodes_quantized(queries, keys, values, cache, mask):
            return _quantized_decode(queries, keys, values, cache, scale, mask)
        if sinks is None and _prefill_kernel and _readable(keys, values, cache):
            if _prefills_quantized(queries, keys, mask):
                return _quantized_prefill(queries, keys, values, cache, scale, mask)
            unpacked_keys, unpacked_values = _unpacked(keys, cache), _unpacked(values, cache)
            if _prefills(queries, unpacked_keys, unpacked_values, None, mask):
                return _prefill_attention(queries, unpacked_keys, unpacked_values, scale, mask)
        return _ORIGINAL(queries, keys, values, cache, scale=scale, mask=mask, sinks=sinks)
    if sinks is None and _decodes(queries, keys, values, cache, _decode_kernel_queries()):
        causal = isinstance(mask, str) and mask == "causal"
        if causal and queries.shape[2] == 1:  # one query sees every key
            mask, causal = None, False
        ext = qmm.extension()
        if mask is None or isinstance(mask, mx.array):
            return ext.sdpa_decode(queries, keys, values, scale, mask)  # type: ignore[no-any-return]
        if causal:
            return ext.sdpa_decode(queries, keys, values, scale, causal=True)  # type: ignore[no-any-return]
    if (
        sinks is None
        and _prefill_kernel
        and _prefills(queries, keys, values, cache, mask)
        and hasattr(qmm.extension(), "softmax_prefill")  # not in a build from before it
    ):
        return _prefill_attention(queries, keys, values, scale, mask)
    return _ORIGINAL(queries, keys, values, cache, scale=scale, mask=mask, sinks=sinks)


def _readable(keys: Any, values: Any, cache: Any) -> bool:
    """K and V as quantized triples of float32 scales, in bits and groups the kernels
    read, on the CPU, with the kernel built."""
    return (
        isinstance(keys, tuple | list)
        and isinstance(values, tuple | list)
        and len(keys) == 3
        and len(values) == 3
        and keys[1].dtype == mx.float32
        and values[1].dtype == mx.float32
        and getattr(cache, "bits", None) in QUANTIZED_BITS
        and getattr(cache, "group_size", None) in QUANTIZED_GROUPS
        and mx.default_device().type == mx.DeviceType.cpu
        and available()
        and hasattr(qmm.extension(), "sdpa_decode_quantized")
    )


def _decodes_quantized(queries: mx.array, keys: Any, values: Any, cache: Any, mask: Any) -> bool:
    """A few query positions against a quantized cache the decode kernel reads."""
    return (
        (mask is None or isinstance(mask, mx.array) or (isinstance(mask, str) and mask == "causal"))
        and queries.ndim == 4
        and 1 <= queries.shape[2] <= _decode_kernel_queries(quantized=True)
        and queries.dtype == mx.float32
        and _readable(keys, values, cache)
    )


def _prefills_quantized(queries: mx.array, keys: Any, mask: Any) -> bool:
    """A chunk the fused kernel reads from the quantized cache in place (a key block
    dequantized at a time), where the float path would unpack the whole cache first."""
    return (
        queries.ndim == 4
        and queries.shape[2] >= FUSED_MIN_QUERIES
        and queries.dtype == mx.float32
        and _fused_kernel()
        and hasattr(qmm.extension(), "sdpa_prefill_quantized")
        and _prefill_mask(mask, queries, keys[0].shape[2])
    )


def _quantized_prefill(
    queries: mx.array, keys: Any, values: Any, cache: Any, scale: float, mask: Any
) -> mx.array:
    ext = qmm.extension()
    causal = isinstance(mask, str)
    array_mask = mask if isinstance(mask, mx.array) else None
    out: mx.array = ext.sdpa_prefill_quantized(
        queries, tuple(keys), tuple(values), scale, cache.group_size, cache.bits, causal,
        array_mask,
    )  # fmt: skip
    return out


def _unpacked(triple: Any, cache: Any) -> mx.array:
    """A quantized cache's K or V as float32 (B, H, T, D), unpacked on every core: for a
    prefill chunk on a CPU without the fused kernel's register tiles (elsewhere
    `sdpa_prefill_quantized` reads the packed rows a key block at a time). MLX's quantized
    matmuls are plain loops on the CPU: a 512-token chunk at a 1,536-token offset took
    29.9 s through them against 3.7 s with float32 K/V (docs/benchmarks.md, round 14)."""
    words, scales, biases = triple
    rows = words.shape[0] * words.shape[1] * words.shape[2]
    flat = qmm.extension().dequantize(
        words.reshape(rows, -1),
        scales.reshape(rows, -1),
        biases.reshape(rows, -1),
        cache.group_size,
        cache.bits,
    )
    unpacked: mx.array = flat.reshape(*words.shape[:3], -1)
    return unpacked


def _quantized_decode(
    queries: mx.array, keys: Any, values: Any, cache: Any, scale: float, mask: Any
) -> mx.array:
    causal = isinstance(mask, str) and mask == "causal"
    if causal and queries.shape[2] == 1:
        mask, causal = None, False
    elif causal:
        mask = None
    ext = qmm.extension()
    out: mx.array = ext.sdpa_decode_quantized(
        queries, keys, values, scale, cache.group_size, cache.bits, mask, causal=causal
    )
    return out


def attend_as_decoding(
    queries: mx.array, keys: Any, values: Any, cache: Any, scale: float, mask: Any
) -> mx.array | None:
    """Several query positions in one call whose every row has exactly the bits of this
    module's one-position (decode) call over the keys that row's mask lets it see, or None
    where that does not hold (another dtype or device, no array mask, more positions than
    the kernel takes, an extension without it).

    The decode kernel computes each row alone: the scores of the keys its mask excludes
    become exact zeros after the softmax, and a zero adds nothing to the lane sums or to
    P.V; a quantized cache's rows are unpacked by position, whatever the call. A
    speculative verify pass (engine/speculative/attention.py) reads each sequence's K and
    V once this way, instead of once per position."""
    if not (isinstance(mask, mx.array) and mask.ndim == 4 and available()):
        return None
    positions = decode_kernel_positions()
    ext = qmm.extension()
    if hasattr(cache, "bits"):
        if not (
            queries.ndim == 4
            and 1 <= queries.shape[2] <= positions
            and queries.dtype == mx.float32
            and _readable(keys, values, cache)
        ):
            return None
        quantized: mx.array = ext.sdpa_decode_quantized(
            queries, keys, values, scale, cache.group_size, cache.bits, mask
        )
        return quantized
    if not _decodes(queries, keys, values, cache, positions):
        return None
    rows: mx.array = ext.sdpa_decode(queries, keys, values, scale, mask)
    return rows


def _model_modules(model: Any) -> list[Any]:
    names = {type(model).__module__}
    names.update(type(m).__module__ for _, m in model.named_modules())
    mods = [sys.modules.get(name) for name in sorted(names) if name.startswith("mlx_lm.")]
    return [mod for mod in mods if mod is not None]


def _fused_kernel() -> bool:
    """The fused prefill kernel takes chunks: built, switched on, with register tiles."""
    ext = qmm.extension()
    return _fused_prefill and hasattr(ext, "sdpa_prefill") and ext.isa() in _FUSED_ISAS


def _decode_kernel_queries(quantized: bool = False) -> int:
    """The most queries a call routes to the decode kernel: 1 (decode) with the prefill
    kernels switched off."""
    if not _prefill_kernel:
        return 1
    fused = _fused_kernel() and not quantized
    return min(SHORT_CHUNK_QUERIES if fused else DECODE_KERNEL_CHUNK_QUERIES,
               decode_kernel_positions())  # fmt: skip


def decode_kernel_positions() -> int:
    """The most query positions one call of the decode kernel takes (1 in older builds)."""
    return int(getattr(qmm.extension(), "SDPA_DECODE_MAX_QUERIES", 1))


def available() -> bool:
    """The extension is built, passed its self-check and has the op (a newer build)."""
    return qmm.status().available and hasattr(qmm.extension(), "sdpa_decode")


def swap_attention(model: Any) -> int:
    """Route the model's mlx_lm modules' attention through the extension (idempotent);
    returns how many modules use it."""
    if not available():
        return 0
    swapped = 0
    for mod in _model_modules(model):
        current = getattr(mod, _NAME, None)
        if current is _ORIGINAL:
            setattr(mod, _NAME, scaled_dot_product_attention)
            current = scaled_dot_product_attention
        swapped += current is scaled_dot_product_attention
    return swapped


def restore_attention(model: Any) -> int:
    """Undo swap_attention for the model's modules (tests, benchmarks); returns how many."""
    restored = 0
    for mod in _model_modules(model):
        if getattr(mod, _NAME, None) is scaled_dot_product_attention:
            setattr(mod, _NAME, _ORIGINAL)
            restored += 1
    return restored


def uses_kernel(model: Any) -> bool:
    return any(
        getattr(mod, _NAME, None) is scaled_dot_product_attention for mod in _model_modules(model)
    )
