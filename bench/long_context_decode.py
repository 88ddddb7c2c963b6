"""One stream's decode step at a long context, full-precision and quantized K/V (issue 29).

    python bench/long_context_decode.py                        # 1k and 4k; float32, 8, 4 bits
    python bench/long_context_decode.py --offsets 2048 --bits 8 --seconds 10

Loads the bundled model as the daemon does (bench/decode_step.py's `load`), reads a
prompt of `offset` tokens in chunks of 512, converts the cache to mlx-lm's
QuantizedKVCache (group 64) for a quantized variant, then decodes greedily one token at a
time for `--seconds`, trimming the cache back after each step so every step sees the
same offset. Reports the median ms per step. The variants run in turn within a round, so
load drift favours none. What it isolates: at long contexts a step reads the whole K/V of
30 layers (189 MB of float32 at 4k tokens), which the quantized cache shrinks to a
quarter (8-bit) or an eighth (4-bit) when the kernel reads it in place.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.decode_step import load
from bench.machine import describe, load_average

CHUNK = 512


def ms_per_step(model: Any, offset: int, bits: int | None, seconds: float) -> float:
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    prompt = mx.array([[(i * 37) % 40000 + 100 for i in range(offset)]])
    for start in range(0, offset, CHUNK):
        mx.eval(model(prompt[:, start : start + CHUNK], cache=cache))
    if bits is not None:
        cache = [layer.to_quantized(group_size=64, bits=bits) for layer in cache]
    token = mx.array([[500]])
    times = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        began = time.perf_counter()
        logits = model(token, cache=cache)
        token = mx.argmax(logits[:, -1], axis=-1, keepdims=True)
        mx.eval(token)
        times.append(time.perf_counter() - began)
        for layer in cache:
            layer.trim(1)
    return 1000 * statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--offsets", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument(
        "--bits", type=int, nargs="*", default=[8, 4], help="quantized variants besides float32"
    )
    parser.add_argument("--seconds", type=float, default=6.0, help="decoding per variant")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    print(f"machine: {describe('auto')}\nload average at start: {load_average()}\n")
    model = load(False)
    variants: list[int | None] = [None, *args.bits]
    print("| round | context | " + " | ".join(label(b) for b in variants) + " |")
    print("| ---: | ---: |" + " ---: |" * len(variants))
    for round_ in range(1, args.rounds + 1):
        for offset in args.offsets:
            cells = [f"{ms_per_step(model, offset, b, args.seconds):.1f} ms" for b in variants]
            print(f"| {round_} | {offset} | " + " | ".join(cells) + " |", flush=True)
    print(f"\nload average at end: {load_average()}")
    return 0


def label(bits: int | None) -> str:
    return "float32 K/V" if bits is None else f"{bits}-bit K/V, group 64"


if __name__ == "__main__":
    raise SystemExit(main())
