"""One decode step of the bundled model in-process, variants side by side (issue 29).

    python bench/decode_step.py                                # rows 1 and 16, exact and int8
    python bench/decode_step.py --prefetch 0 4096 8192 16384   # prefetch distances
    python bench/decode_step.py --parallel-min 4194304 2097152 --paths grouped ungrouped

Loads the model as the daemon does (dtype auto: the quantized kernel where built, with
OpenBLAS chosen first), then decodes greedily from one token on `rows` rows, pipelined
as mlx-lm's generator is (the next step's graph is built while this one computes), and
reports the best of 3 rounds of ms per step for each variant: every pair of the kernel's
split threshold (`--parallel-min`) and weight prefetch distance (`--prefetch`, bytes; 0:
off, round 8's build), and each `--paths` entry: `append` (a decoder layer's step in
three nodes, the cache update inside the attention node: round 16's build), `layer` (a
decoder layer's step in two nodes around mlx_lm's cache update and the attention node,
models/cpu/decoder.py: round 15's build), `grouped` (one node per op, sibling
projections grouped in one call, models/cpu/projections.py: rounds 8-14), `ungrouped`
(one call per projection: round 7). Variants alternate within a round so that load drift
favours none. No HTTP, no scheduler: bench/qmm.py measures the daemon.

    python bench/decode_step.py --rows 1 16 --prefetch 8192 --paths append layer
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.machine import load_average
from bench.peers import model_directory


def load(int8: bool) -> Any:
    from vllm_mlx.models.cpu import blas

    blas.configure()
    from vllm_mlx.config.model import ModelSettings
    from vllm_mlx.models.loader import load_model

    settings = ModelSettings(
        name="m", source=str(model_directory()), dtype="auto", int8_activations=int8
    )
    return load_model(settings, Path(tempfile.mkdtemp(prefix="decode-step-"))).model


def groups_of(model: Any) -> list[Any]:
    found = {}
    for _, module in model.named_modules():
        group = getattr(module, "projection_group", None)
        if group is not None:
            found[id(group)] = group
    return list(found.values())


def ms_per_step(model: Any, rows: int, steps: int) -> float:
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    token = mx.array([[1]] * rows)
    for _ in range(5):
        token = mx.argmax(model(token, cache=cache)[:, -1], axis=-1, keepdims=True)
        mx.eval(token)
    started = time.perf_counter()
    for _ in range(steps):
        token = mx.argmax(model(token, cache=cache)[:, -1], axis=-1, keepdims=True)
        mx.async_eval(token)
    mx.eval(token)
    return 1e3 * (time.perf_counter() - started) / steps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--parallel-min", type=int, nargs="+", default=[2097152])
    parser.add_argument("--prefetch", type=int, nargs="+", default=[0, 8192])
    paths = ["append", "layer", "grouped", "ungrouped"]
    parser.add_argument("--paths", nargs="+", choices=paths, default=["append"])
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from vllm_mlx.models.cpu import blas

    blas.configure()  # before anything imports mlx, or MLX's bundled BLAS stays (14x slower)
    from vllm_mlx.models.cpu import decoder, qmm

    print(f"load average at start: {load_average()}\n")
    print("| activations | rows | path | parallel_min | prefetch | ms per step (best) |")
    print("| --- | ---: | --- | ---: | ---: | ---: |")
    variants = [
        (path, p, d) for path in args.paths for p in args.parallel_min for d in args.prefetch
    ]
    for int8 in (False, True):
        model = load(int8)
        ext, groups = qmm.extension(), groups_of(model)
        defaults = ext.parallel_min(), ext.prefetch_distance()
        kind = "int8" if int8 and ext.int8_available() else "exact"
        for rows in args.rows:
            best: dict[tuple[str, int, int], float] = {}
            for _ in range(args.rounds):
                for variant in variants:
                    path, parallel_min, prefetch = variant
                    decoder.use_fused_layers(path in ("append", "layer"))
                    decoder.use_appended_attention(path == "append")
                    for group in groups:
                        group.active = path != "ungrouped"
                    ext.set_parallel_min(parallel_min)
                    ext.set_prefetch_distance(prefetch)
                    ms = ms_per_step(model, rows, args.steps)
                    best[variant] = min(ms, best.get(variant, ms))
            for (path, parallel_min, prefetch), ms in best.items():
                row = f"| {kind} | {rows} | {path} | {parallel_min} | {prefetch} | {ms:.2f} |"
                print(row, flush=True)
        ext.set_parallel_min(defaults[0])
        ext.set_prefetch_distance(defaults[1])
    print(f"\nload average at end: {load_average()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
