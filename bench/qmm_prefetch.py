"""The kernel's products one at a time, at several weight prefetch distances (issue 29).

    python bench/qmm_prefetch.py                       # one thread, int8 and exact
    python bench/qmm_prefetch.py --threads 2 --prefetch 0 8192

The bundled model's decode products (one activation row) on random weights quantized as
its are (4-bit layers, 8-bit tied lm_head, group 32, float16 scales), each in enough
copies that they stream from memory rather than cache. Reports the best of `--rounds`
of each product's time and the bytes it read per second, for each prefetch distance
(`set_prefetch_distance`, bytes; 0: off), distances alternating within a round.
bench/read_order.c shows why the distance matters on a CPU without the kernel.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.machine import load_average

# (name, output rows, inputs, bits, copies): about 40 MiB or more of each.
PRODUCTS = (
    ("lm_head", 49152, 576, 8, 3),
    ("gate/up", 3072, 576, 4, 40),
    ("down", 576, 1536, 4, 60),
    ("q/k/v", 960, 576, 4, 100),
    ("o", 576, 576, 4, 160),
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--prefetch", type=int, nargs="+", default=[0, 2048, 4096, 8192, 16384])
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    import mlx.core as mx

    from vllm_mlx.models.cpu import qmm

    ext = qmm.extension()
    qmm.set_threads(args.threads)
    default = ext.prefetch_distance()
    int8_modes = [True, False] if ext.int8_available() else [False]
    print(f"load average at start: {load_average()}; {ext.isa()}, {args.threads} thread(s)\n")
    print("| product | activations | " + " | ".join(f"{d} B" for d in args.prefetch) + " |")
    print("| --- | --- |" + " ---: |" * len(args.prefetch))
    for name, n, k, bits, copies in PRODUCTS:
        layers = []
        for seed in range(copies):
            w = mx.random.normal((n, k), key=mx.random.key(seed))
            q, s, b = mx.quantize(w, group_size=32, bits=bits)
            layers.append((q, s.astype(mx.float16), b.astype(mx.float16)))
        x = mx.random.normal((1, k), key=mx.random.key(copies))
        mx.eval(layers, x)
        size = sum(a.nbytes for a in layers[0])
        for int8 in int8_modes:
            best: dict[int, float] = {}
            for _ in range(args.rounds):
                for distance in args.prefetch:
                    ext.set_prefetch_distance(distance)
                    started = time.perf_counter()
                    mx.eval([ext.quantized_matmul(x, *w, 32, bits, int8=int8) for w in layers])
                    took = (time.perf_counter() - started) / copies
                    best[distance] = min(took, best.get(distance, took))
            cells = " | ".join(
                f"{1e6 * best[d]:.0f} us, {size / best[d] / 1e9:.1f} GB/s" for d in args.prefetch
            )
            print(f"| {name} | {'int8' if int8 else 'exact'} | {cells} |", flush=True)
    ext.set_prefetch_distance(default)
    print(f"\nload average at end: {load_average()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
