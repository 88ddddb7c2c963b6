"""What a prompt chunk's attention costs after a context, as the model's layers route it
(models/cpu/attention.py): the bundled model's shape, 9 query heads over 3 KV heads of
64, for its 30 layers (issue 29, round 24).

    python bench/attention_chunk.py                              # 4-100 queries after 256-4k
    python bench/attention_chunk.py --contexts 4096 --queries 4 8 16
    python bench/attention_chunk.py --isa avx2                   # as an AVX2-only CPU runs
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

LAYERS = 30  # the bundled SmolLM2-135M's
Q_HEADS, KV_HEADS, HEAD_DIM = 9, 3, 64


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[256, 1024, 4096])
    parser.add_argument("--queries", type=int, nargs="+", default=[4, 8, 16, 32, 48, 63, 64, 100])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--isa", default="best", help="the extension's instruction set")
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
        for m in args.queries:
            q = mx.random.normal((1, Q_HEADS, m, HEAD_DIM), key=mx.random.key(m))
            k, v = keys[:, :, : context + m, :], values[:, :, : context + m, :]
            mx.eval(q)
            best = float("inf")
            for _ in range(args.repeat):
                began = time.perf_counter()
                for _ in range(LAYERS):
                    out = attention.scaled_dot_product_attention(q, k, v, None, 0.125, "causal")
                    mx.eval(out)
                best = min(best, time.perf_counter() - began)
            row = {"context": context, "queries": m, "ms": round(1e3 * best, 1)}
            row["isa"] = ext.isa()
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
