"""The kernel's matmuls alone, per decode step of the bundled model: variants side by side.

    python bench/qmm_layers.py                          # threads 1 vs 2, every ISA
    python bench/qmm_layers.py --baseline /tmp/old.so   # also an older build of _qmm
    python bench/qmm_layers.py --bits 4 --int8          # the layers at 4 bits, int8 too

One "step" evaluates every quantized layer of the model (211 for SmolLM2-135M) on `rows`
random activation rows in one MLX graph, as a decode step does. Each variant runs in a
fresh process; variants alternate over rounds so that load drift favours none. Reports
wall and CPU (process_time: every thread of the process, spinning included) per step.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.machine import load_average
from bench.peers import model_directory

# Run in a fresh interpreter: argv = model_dir, cache, rows, steps, threads, isa, so,
# parallel_min (-1: the build's default), int8 ("1": int8 activations), bits (0: as stored;
# 4 or 8: every layer requantized so, group size kept, as a model quantized so would be).
STEP_CODE = """
import importlib.util, json, sys, time
from pathlib import Path
from typing import Any
so = sys.argv[7]
if so:  # an older build, in place of the one in the tree
    spec = importlib.util.spec_from_file_location("vllm_mlx.kernels._qmm", so)
    mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
    sys.modules["vllm_mlx.kernels._qmm"] = mod
from vllm_mlx.models.cpu import blas
blas.configure()
import mlx.core as mx
from vllm_mlx.config.model import ModelSettings
from vllm_mlx.models.cpu import qmm
from vllm_mlx.models.loader import load_model
settings = ModelSettings(name="m", source=sys.argv[1], dtype="auto")
model = load_model(settings, Path(sys.argv[2])).model
ext = qmm.extension()
ext.set_threads(int(sys.argv[5]))
if sys.argv[6] != "default":
    ext.set_isa(sys.argv[6])
if int(sys.argv[8]) >= 0:
    ext.set_parallel_min(int(sys.argv[8]))
rows, steps = int(sys.argv[3]), int(sys.argv[4])
kinds = (qmm.KernelQuantizedLinear, qmm.KernelQuantizedEmbedding)
layers = [m for _, m in model.named_modules() if isinstance(m, kinds)]
for m in layers:
    m.int8_activations = sys.argv[9] == "1"
    if int(sys.argv[10]) not in (0, m.bits):
        w = mx.dequantize(m["weight"], m["scales"], m["biases"], m.group_size, m.bits)
        wq, s, b = mx.quantize(w, group_size=m.group_size, bits=int(sys.argv[10]))
        dtype = m["scales"].dtype
        m["weight"], m["scales"], m["biases"] = wq, s.astype(dtype), b.astype(dtype)
        m.bits = int(sys.argv[10])
        mx.eval(m.parameters())
xs = [mx.random.normal((rows, m["weight"].shape[1] * 32 // m.bits)) for m in layers]
mx.eval(xs)
def step():
    mx.eval([qmm._matmul(m, x) for m, x in zip(layers, xs)])
for _ in range(3):
    step()
wall, cpu = time.perf_counter(), time.process_time()
for _ in range(steps):
    step()
wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
print(json.dumps({"layers": len(layers), "isa": ext.isa(),
                  "wall_ms": 1e3 * wall / steps, "cpu_ms": 1e3 * cpu / steps}))
"""


@dataclass(frozen=True)
class Variant:
    threads: int
    isa: str = "default"
    so: str = ""  # an older build of _qmm; "": this tree's
    parallel_min: int = -1  # -1: the build's default split threshold
    int8: bool = False  # int8 activations (`int8_activations`)

    def label(self) -> str:
        build = "baseline" if self.so else "this tree"
        split = "" if self.parallel_min < 0 else f", split >= {self.parallel_min}"
        return f"{build}, {self.threads} threads{split}{', int8' if self.int8 else ''}"


def run_variant(model_dir: Path, rows: int, steps: int, v: Variant, bits: int) -> dict[str, Any]:
    cache = Path(os.environ.get("VLLM_MLX_BENCH_CACHE", "/tmp/vllm-mlx-bench-cache"))
    args = [str(model_dir), str(cache), str(rows), str(steps), str(v.threads), v.isa, v.so]
    out = subprocess.run(
        [sys.executable, "-c", STEP_CODE, *args, str(v.parallel_min), "1" if v.int8 else "0",
         str(bits)],
        capture_output=True, text=True, check=True, timeout=900,
    )  # fmt: skip
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def variants(args: argparse.Namespace) -> list[Variant]:
    found = [Variant(t, isa) for isa in args.isa for t in args.threads]
    found += [Variant(2, "default", "", m) for m in args.parallel_min]
    if args.int8:
        found += [Variant(t, "default", int8=True) for t in args.threads]
        found += [Variant(2, "default", "", m, int8=True) for m in args.parallel_min]
    if args.baseline:
        found += [
            Variant(t, isa, args.baseline, int8=args.int8) for isa in args.isa for t in args.threads
        ]
    return found


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--isa", nargs="+", default=["default"])
    parser.add_argument("--parallel-min", type=int, nargs="*", default=[],
                        help="split thresholds to try at 2 threads")  # fmt: skip
    parser.add_argument("--baseline", default="", help="an older _qmm .so to compare")
    parser.add_argument("--int8", action="store_true", help="also with int8 activations")
    parser.add_argument("--bits", type=int, choices=[0, 4, 8], default=0,
                        help="requantize every layer to these bits (0: as stored)")  # fmt: skip
    args = parser.parse_args()
    model_dir = model_directory()
    chosen = variants(args)
    print(f"load average at start: {load_average()}")
    print(f"weights: {f'requantized to {args.bits} bits' if args.bits else 'as stored'}\n")
    print("| rows | variant | isa | wall ms/step | CPU ms/step |")
    print("| ---: | --- | --- | ---: | ---: |")
    for rows in args.rows:
        totals = {v: [0.0, 0.0] for v in chosen}
        for r in range(args.rounds):
            for v in chosen if r % 2 == 0 else chosen[::-1]:
                res = run_variant(model_dir, rows, args.steps, v, args.bits)
                totals[v][0] += res["wall_ms"] / args.rounds
                totals[v][1] += res["cpu_ms"] / args.rounds
                print(f"| {rows} | {v.label()} | {res['isa']} | {res['wall_ms']:.1f} "
                      f"| {res['cpu_ms']:.1f} |", flush=True)  # fmt: skip
        for v, (wall, cpu) in totals.items():
            print(f"- rows {rows}, {v.label()}, isa {v.isa}: mean wall {wall:.1f} ms, "
                  f"CPU {cpu:.1f} ms per step")  # fmt: skip
    print(f"\nload average at end: {load_average()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
