"""One decode step of the bundled model in-process, variants side by side (issue 29).

    python bench/decode_step.py                           # rows 1 and 16, exact and int8
    python bench/decode_step.py --rows 1 2 4 --parallel-min 4194304 2097152

Loads the model as the daemon does (dtype auto: the quantized kernel where built, with
OpenBLAS chosen first), then decodes greedily from one token on `rows` rows, pipelined
as mlx-lm's generator is (the next step's graph is built while this one computes), and
reports the best of 3 rounds of ms per step for each variant: sibling projections one
call per layer at the first `--parallel-min` (the kernel's split threshold: round 7's
build), then grouped in one call (models/cpu/projections.py) at each threshold.
Variants alternate within a round so that load drift favours none. No HTTP, no
scheduler: bench/qmm.py measures the daemon.
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
    parser.add_argument("--parallel-min", type=int, nargs="+", default=[4194304, 2097152])
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from vllm_mlx.models.cpu import qmm

    print(f"load average at start: {load_average()}\n")
    print("| activations | rows | grouped | parallel_min | ms per step (best of rounds) |")
    print("| --- | ---: | --- | ---: | ---: |")
    for int8 in (False, True):
        model = load(int8)
        ext, groups = qmm.extension(), groups_of(model)
        default = ext.parallel_min()
        # Ungrouped at the first threshold (the build before round 8), then grouped at each.
        variants = [(False, args.parallel_min[0])] + [(True, p) for p in args.parallel_min]
        for rows in args.rows:
            best: dict[tuple[bool, int], float] = {}
            for _ in range(args.rounds):
                for grouped, parallel_min in variants:
                    for group in groups:
                        group.active = grouped
                    ext.set_parallel_min(parallel_min)
                    ms = ms_per_step(model, rows, args.steps)
                    best[grouped, parallel_min] = min(ms, best.get((grouped, parallel_min), ms))
            for (grouped, parallel_min), ms in best.items():
                kind = "int8" if int8 and qmm.extension().int8_available() else "exact"
                print(f"| {kind} | {rows} | {grouped} | {parallel_min} | {ms:.2f} |", flush=True)
        ext.set_parallel_min(default)
    print(f"\nload average at end: {load_average()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
