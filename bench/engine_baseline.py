"""Engine-only baseline: mlx-lm's stream_generate and BatchGenerator in-process.

This is the ceiling the server is measured against: the same weights, BLAS and prompts
with no HTTP, no asyncio and no detokenization. Run as its own process (the BLAS is
chosen once per process, before mlx is imported):

    python -m bench.engine_baseline --model-dir DIR --dtype auto --batch-sizes 1,16
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from bench.prompts import PROMPT_SETS, PromptSet


def _prompt_tokens(tokenizer: Any, prompt_set: PromptSet, index: int) -> list[int]:
    tokens: list[int] = tokenizer.apply_chat_template(
        prompt_set.messages(index), add_generation_prompt=True, tokenize=True
    )
    return tokens


def measure_stream_generate(
    model: Any, tokenizer: Any, prompt: list[int], max_tokens: int
) -> dict[str, Any]:
    from mlx_lm.generate import stream_generate

    started = time.perf_counter()
    times: list[float] = []
    for _ in stream_generate(model, tokenizer, prompt, max_tokens=max_tokens):
        times.append(time.perf_counter())
    count = len(times)
    decode = (count - 1) / (times[-1] - times[0]) if count > 1 else None
    return {
        "prompt_tokens": len(prompt),
        "completion_tokens": count,
        "ttft_s": times[0] - started if times else None,
        "decode_tok_s": decode,
    }


def measure_batch(
    model: Any, tokenizer: Any, prompts: list[list[int]], max_tokens: int
) -> dict[str, Any]:
    from mlx_lm.generate import BatchGenerator

    generator = BatchGenerator(
        model,
        stop_tokens=[[t] for t in sorted(tokenizer.eos_token_ids)],
        completion_batch_size=len(prompts),
        prefill_batch_size=min(8, len(prompts)),
    )
    started = time.perf_counter()
    generator.insert(prompts, max_tokens=[max_tokens] * len(prompts))
    live, tokens = len(prompts), 0
    first_decode: float | None = None
    while live:
        _, responses = generator.next()
        if responses and first_decode is None:
            first_decode = time.perf_counter()
        tokens += len(responses)
        live -= sum(1 for r in responses if r.finish_reason is not None)
    wall = time.perf_counter() - started
    generator.close()
    return {
        "batch_size": len(prompts),
        "completion_tokens": tokens,
        "wall_s": wall,
        "aggregate_tok_s": tokens / wall,
        "prefill_s": (first_decode or started) - started,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    from vllm_mlx.models.cpu import blas

    choice = blas.configure(args.blas)
    from mlx_lm.utils import load

    from vllm_mlx.models import dtype

    model, tokenizer = load(args.model_dir)[:2]
    model, decision = dtype.apply_dtype(model, args.dtype, blas_optimized=choice.optimized)
    prompt_set = PROMPT_SETS[args.prompt_set]
    warm = _prompt_tokens(tokenizer, prompt_set, 10_000)
    measure_stream_generate(model, tokenizer, warm, 4)  # first-call costs out of the numbers
    out: dict[str, Any] = {"blas": choice.name, "dtype": decision.chosen}
    out["stream_generate"] = measure_stream_generate(
        model, tokenizer, _prompt_tokens(tokenizer, prompt_set, 0), args.max_tokens
    )
    out["batch"] = [
        measure_batch(
            model,
            tokenizer,
            [_prompt_tokens(tokenizer, prompt_set, i) for i in range(size)],
            args.max_tokens,
        )
        for size in args.batch_sizes
    ]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--blas", default="auto")
    parser.add_argument("--prompt-set", default="short", choices=sorted(PROMPT_SETS))
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument(
        "--batch-sizes", type=lambda s: [int(x) for x in s.split(",") if x], default=[1, 16]
    )
    json.dump(run(parser.parse_args(argv)), sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
