"""What a prompt chunk's attention costs after a context, as the model's layers route it
(models/cpu/attention.py): the bundled model's shape, 9 query heads over 3 KV heads of
64, for its 30 layers (issue 29, round 24).

    python bench/attention_chunk.py                              # 4-100 queries after 256-4k
    python bench/attention_chunk.py --contexts 4096 --queries 4 8 16
    python bench/attention_chunk.py --isa avx2                   # as an AVX2-only CPU runs
    python bench/attention_chunk.py --kv-bits 8                  # over kv_cache.bits: 8
    PYTHONPATH=/other/checkout/daemon python bench/attention_chunk.py   # another build

Each size runs the swapped `scaled_dot_product_attention` (causal, K and V as slices of a
longer cache buffer, as mlx_lm's KVCache returns them) once a layer, 30 layers, and prints
one JSON line: the best of `--repeat` rounds in ms, and the instruction set. Random
inputs: the kernels' time does not depend on the values.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

LAYERS = 30  # the bundled SmolLM2-135M's
Q_HEADS, KV_HEADS, HEAD_DIM = 9, 3, 64


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[256, 1024, 4096])
    parser.add_argument("--queries", type=int, nargs="+", default=[4, 8, 16, 32, 48, 63, 64, 100])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--isa", default="best", help="the extension's instruction set")
    parser.add_argument(
        "--kv-bits", type=int, choices=[4, 8], help="a quantized KV cache (kv_cache.bits)"
    )
    parser.add_argument("--kv-group", type=int, default=64, help="its group size")
    args = parser.parse_args()
    from vllm_mlx.models.cpu import blas

    blas.configure("auto")  # before mlx is imported, as `serve` does
    import mlx.core as mx

    from vllm_mlx.models.cpu import attention, qmm

    ext = qmm.extension()
    ext.set_isa(args.isa)
    for context in args.contexts:
        room = context + max(args.queries) + 256  # the cache buffer grows in steps
        keys = mx.random.normal((1, KV_HEADS, room, HEAD_DIM), key=mx.random.key(1))
        values = mx.random.normal((1, KV_HEADS, room, HEAD_DIM), key=mx.random.key(2))
        mx.eval(keys, values)
        cache: object = None
        if args.kv_bits:  # mlx_lm's QuantizedKVCache: (words, scales, biases) buffers
            cache = SimpleNamespace(bits=args.kv_bits, group_size=args.kv_group)
            keys = mx.quantize(keys, group_size=args.kv_group, bits=args.kv_bits)
            values = mx.quantize(values, group_size=args.kv_group, bits=args.kv_bits)
            mx.eval(keys, values)
        for m in args.queries:
            q = mx.random.normal((1, Q_HEADS, m, HEAD_DIM), key=mx.random.key(m))
            k, v = _prefix(keys, context + m), _prefix(values, context + m)
            mx.eval(q)
            best = float("inf")
            for _ in range(args.repeat):
                began = time.perf_counter()
                for _ in range(LAYERS):
                    out = attention.scaled_dot_product_attention(q, k, v, cache, 0.125, "causal")
                    mx.eval(out)
                best = min(best, time.perf_counter() - began)
            row = {"context": context, "queries": m, "ms": round(1e3 * best, 1)}
            row["isa"] = ext.isa()
            row["kv_bits"] = args.kv_bits or 32
            print(json.dumps(row), flush=True)
    return 0


def _prefix(buffer: Any, length: int) -> Any:
    """The first `length` positions, as a cache returns them: a slice, or a triple of."""
    if isinstance(buffer, list | tuple):
        return tuple(part[:, :, :length, :] for part in buffer)
    return buffer[:, :, :length, :]


if __name__ == "__main__":
    raise SystemExit(main())
