"""One layer's prefill attention on the CPU: the bundled model's shapes (9 query heads,
3 KV heads, head dim 64, float32), a chunk of queries at the end of the keys (causal).

    python bench/prefill_attention.py --keys 512 2048 4096 --rounds 3
    python bench/prefill_attention.py --queries 16 24 32 48 --keys 512 4096 --batch 1 4

Times models/cpu/attention.py's prefill paths on the same inputs, alternating within each
round (so a change in the machine's load hits every path): `fused` (the extension's fused
kernel, `sdpa_prefill`, called directly: the swapped function uses it from
FUSED_MIN_QUERIES queries), `softmax` (the swapped function with the fused kernel off:
MLX's two BLAS products around the extension's `softmax_prefill`, the path before it)
and `mlx` (mlx_lm's own function). Prints one JSON
line per shape: the best of `--repeat` calls per round, for every round, in milliseconds.
`--threads 1` compares one core's work (steadier on a shared machine).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, nargs="+", default=[512])
    parser.add_argument("--keys", type=int, nargs="+", default=[512, 2048, 4096])
    parser.add_argument("--batch", type=int, nargs="+", default=[1])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--threads", type=int, help="the extension's and OpenBLAS's threads (default: all)"
    )
    parser.add_argument(
        "--paths", nargs="+", choices=["fused", "softmax", "mlx"], default=["softmax", "fused"]
    )
    args = parser.parse_args()
    if args.threads:  # read by OpenBLAS when it is loaded
        os.environ["OPENBLAS_NUM_THREADS"] = str(args.threads)
    from vllm_mlx.models.cpu import blas

    blas.configure("auto")  # before mlx is imported, as `serve` does
    import mlx.core as mx
    from mlx_lm.models import base

    from vllm_mlx.models.cpu import attention, qmm

    if args.threads:
        qmm.extension().set_threads(args.threads)

    def path_fn(name: str, q: mx.array, k: mx.array, v: mx.array) -> Callable[[], mx.array]:
        if name == "fused":  # the kernel itself, whatever the query count
            return lambda: qmm.extension().sdpa_prefill(q, k, v, 0.125, True)
        if name == "mlx":
            original: Any = base.scaled_dot_product_attention
            return lambda: original(q, k, v, None, 0.125, "causal")

        def softmax() -> mx.array:  # the function the model calls, without the fused kernel
            attention.use_fused_prefill(False)
            try:
                return attention.scaled_dot_product_attention(q, k, v, None, 0.125, "causal")
            finally:
                attention.use_fused_prefill(True)

        return softmax

    for batch in args.batch:
        for queries in args.queries:
            for keys in args.keys:
                q = mx.random.normal((batch, 9, queries, 64), key=mx.random.key(0))
                k = mx.random.normal((batch, 3, keys, 64), key=mx.random.key(1))
                v = mx.random.normal((batch, 3, keys, 64), key=mx.random.key(2))
                mx.eval(q, k, v)
                fns = {name: path_fn(name, q, k, v) for name in args.paths}
                times: dict[str, list[float]] = {name: [] for name in args.paths}
                for _ in range(args.rounds):
                    for name, fn in fns.items():
                        best = float("inf")
                        for _ in range(args.repeat):
                            began = time.perf_counter()
                            mx.eval(fn())
                            best = min(best, time.perf_counter() - began)
                        times[name].append(round(best * 1e3, 2))
                row = {"batch": batch, "queries": queries, "keys": keys, "ms": times}
                print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
