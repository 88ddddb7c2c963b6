"""What one prefill chunk costs after a long context: the pieces prefill pacing cuts a
prompt into while other streams decode (engine/prefill_pacing.py, issue 29).

    python bench/prefill_chunk.py                                 # 1-64 tokens after 4,096
    python bench/prefill_chunk.py --offset 2048 --chunks 4 8 16 --repeat 5
    python bench/prefill_chunk.py --offset 256 --chunks 1 4 8 16 32 --layers fused mlx-lm

Loads the bundled model with the daemon's loader (`dtype: auto`: the CPU kernel and
OpenBLAS, chosen before mlx is imported), reads `--offset` tokens into one KV cache in
512-token chunks, then for each chunk size runs 6 chunks of that many tokens after them
(one model call each, as the pacer's steps do), trimming the cache back to the offset
between sizes. Prints one JSON line per size: the best of `--repeat` rounds, in ms a chunk
and ms a token (sizes alternate within a round, so load drift favours none). A chunk
pays for a whole model call whatever its size (the weights read once more, attention
over every earlier key): the table of round 19 in docs/benchmarks.md.

A chunk is evaluated as the engine's prompt processing evaluates it: the caches' state,
no logits. `--layers fused mlx-lm` times each size both ways, alternating: the fused
decoder layers (models/cpu/decoder.py, round 22) and mlx_lm's layer over the
one-node-per-op swaps.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

READ_CHUNK = 512  # how the context is read first (engine.prefill_step_size)
CHUNKS_PER_SIZE = 6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--offset", type=int, default=4096, help="tokens of context first")
    parser.add_argument("--chunks", type=int, nargs="+", default=[1, 4, 6, 8, 16, 32, 64])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--layers", nargs="+", choices=["fused", "mlx-lm"], default=["fused"])
    args = parser.parse_args()
    from vllm_mlx.models.cpu import blas

    blas.configure("auto")  # before mlx is imported, as `serve` does
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from vllm_mlx.config.model import ModelSettings
    from vllm_mlx.models.cpu import decoder
    from vllm_mlx.models.loader import load_generation_model

    model = ModelSettings(name="bench", source="builtin:smollm2-135m-instruct")
    with tempfile.TemporaryDirectory() as cache_dir:
        net = load_generation_model(model, Path(cache_dir)).model
    vocab = int(net.args.vocab_size)
    total = args.offset + CHUNKS_PER_SIZE * max(args.chunks)
    tokens = mx.array([[(7919 * i) % (vocab - 100) + 50 for i in range(total)]])
    cache = make_prompt_cache(net)
    for start in range(0, args.offset, READ_CHUNK):
        net(tokens[:, start : min(start + READ_CHUNK, args.offset)], cache=cache)
        mx.eval([c.state for c in cache])
    variants = [(layers, n) for n in args.chunks for layers in args.layers]
    times: dict[tuple[str, int], list[float]] = {v: [] for v in variants}
    for _ in range(args.repeat):
        for layers, n in variants:
            decoder.use_fused_layers(layers == "fused")
            began = time.perf_counter()
            for k in range(CHUNKS_PER_SIZE):
                at = args.offset + k * n
                net.model(tokens[:, at : at + n], cache=cache)  # no logits, as the engine
                mx.eval([c.state for c in cache])
            times[(layers, n)].append((time.perf_counter() - began) / CHUNKS_PER_SIZE)
            for layer in cache:
                layer.trim(layer.offset - args.offset)
    for (layers, n), seconds in times.items():
        best = 1e3 * min(seconds)
        row = {"offset": args.offset, "layers": layers, "chunk": n, "ms": round(best, 1)}
        row |= {"ms_per_token": round(best / n, 2), "runs_ms": [round(1e3 * s, 1) for s in seconds]}
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
