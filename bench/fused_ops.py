"""Decode steps of the bundled model with and without one of the extension's fused ops.

    python bench/fused_ops.py [--op attention|norms] [--context 200] [--rounds 8] [--steps 16]

`attention`: the decode attention (models/attention.py); `norms`: RMS norm and RoPE
(models/fused_norms.py). The other fused ops stay on in both variants.

One process, one loaded model; each batch size gets two caches prefilled alike (batch 1:
mlx_lm's KVCache, no mask; larger batches: BatchKVCache with left padding, so the bool
mask path runs as in the engine). Rounds alternate the variants so load drift on a shared
machine favours neither; prints the median ms per step of each and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache, make_prompt_cache

from bench.peers import model_directory
from vllm_mlx.config.model import ModelSettings
from vllm_mlx.models.cpu import attention
from vllm_mlx.models.cpu import norms as fused_norms
from vllm_mlx.models.loaded import LoadedModel
from vllm_mlx.models.loader import load_model


def prefilled(model: Any, batch: int, context: int) -> tuple[list[Any], mx.array]:
    tokens = mx.random.randint(0, 1000, (batch, context), key=mx.random.key(batch))
    if batch == 1:
        cache = make_prompt_cache(model)
    else:
        cache = [BatchKVCache([i % 7 for i in range(batch)]) for _ in model.layers]
    logits = model(tokens, cache=cache)
    y = mx.argmax(logits[:, -1, :], axis=-1)[:, None]
    mx.eval(y, [c.state for c in cache])
    return cache, y


def timed(model: Any, cache: list[Any], y: mx.array, steps: int) -> tuple[float, mx.array]:
    start = time.perf_counter()
    for _ in range(steps):
        y = mx.argmax(model(y, cache=cache)[:, -1, :], axis=-1)[:, None]
        mx.eval(y)
    return (time.perf_counter() - start) * 1000 / steps, y


SWITCHES = {
    "attention": (attention.swap_attention, attention.restore_attention),
    "norms": (fused_norms.swap_norms, fused_norms.restore_norms),
}


def compare(model: Any, batch: int, args: argparse.Namespace) -> None:
    swap, restore = SWITCHES[args.op]
    states = {name: prefilled(model, batch, args.context) for name in ("mlx", "kernel")}
    times: dict[str, list[float]] = {"mlx": [], "kernel": []}
    for _ in range(args.rounds):
        for name in ("mlx", "kernel"):
            (swap if name == "kernel" else restore)(model)
            cache, y = states[name]
            ms, y = timed(model, cache, y, args.steps)
            states[name] = (cache, y)
            times[name].append(ms)
    mlx, kernel = (statistics.median(times[n]) for n in ("mlx", "kernel"))
    print(
        f"{args.op}, batch {batch:>2}, context {args.context}+: MLX {mlx:7.2f} ms/step, "
        f"kernel {kernel:7.2f} ms/step, ratio {mlx / kernel:.2f}x",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--op", choices=sorted(SWITCHES), default="attention")
    parser.add_argument("--context", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    args = parser.parse_args()
    settings = ModelSettings(name="m", source=str(model_directory()), dtype="auto")
    loaded = load_model(settings, Path("/tmp/vllm-mlx-bench-cache"))
    assert isinstance(loaded, LoadedModel)
    model = loaded.model
    if not attention.available():
        sys.exit("the extension's sdpa_decode is not available")
    for batch in args.batches:
        compare(model, batch, args)


if __name__ == "__main__":
    main()
