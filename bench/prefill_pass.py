"""Prefill of the bundled model as the daemon runs it: chunks of `engine.prefill_step_size`
(512) rows through the swapped quantized layers, one process per measurement.

    python bench/prefill_pass.py --tokens 512 2048 4096 --repeat 2
    python bench/prefill_pass.py --attention softmax fused --repeat 2

Loads the bundled model with the daemon's loader (`dtype: auto`: the CPU kernel and
OpenBLAS), then for each length feeds a fresh KV cache 512-token chunks, as the
scheduler does, and evaluates the cache (prefill computes no logits but the last).
Prints one JSON line per length and prefill attention: the best time of `--repeat`, every
time, and tokens/s. `--attention` names the prefill attention paths to compare
(models/cpu/attention.py), run in turn within each repeat (alternating, so a change in
the machine's load hits both): `fused` (the extension's fused kernel, the default),
`softmax` (MLX's two BLAS products around the extension's softmax: the path before it),
`mlx` (mlx_lm's own function). Run it under two checkouts' PYTHONPATH, alternating, to
compare builds of the kernel.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CHUNK = 512


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[512, 2048, 4096])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument(
        "--attention", nargs="+", choices=["fused", "softmax", "mlx"], default=["fused"]
    )
    args = parser.parse_args()
    from vllm_mlx.models.cpu import blas

    blas.configure("auto")  # before mlx is imported, as `serve` does
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from vllm_mlx.config.model import ModelSettings
    from vllm_mlx.models.cpu import attention
    from vllm_mlx.models.loader import load_generation_model

    def use(path: str) -> None:
        attention.use_prefill_kernel(path != "mlx")
        attention.use_fused_prefill(path == "fused")

    model = ModelSettings(name="bench", source="builtin:smollm2-135m-instruct")
    with tempfile.TemporaryDirectory() as cache_dir:
        loaded = load_generation_model(model, Path(cache_dir))
    net = loaded.model
    vocab = int(net.args.vocab_size)
    for length in args.tokens:
        tokens = mx.array([[(7919 * i) % (vocab - 100) + 50 for i in range(length)]])
        times: dict[str, list[float]] = {path: [] for path in args.attention}
        for _ in range(args.repeat):
            for path in args.attention:
                use(path)
                cache = make_prompt_cache(net)
                began = time.perf_counter()
                for start in range(0, length - 1, CHUNK):
                    net(tokens[:, start : min(start + CHUNK, length - 1)], cache=cache)
                    mx.eval([c.state for c in cache])
                mx.eval(net(tokens[:, length - 1 :], cache=cache))  # the last token's logits
                times[path].append(time.perf_counter() - began)
        for path, seconds in times.items():
            best = min(seconds)
            print(json.dumps({"tokens": length, "attention": path, "seconds": round(best, 3),
                              "runs": [round(t, 3) for t in seconds],
                              "tok_s": round(length / best, 1)}), flush=True)  # fmt: skip
    use("fused")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
