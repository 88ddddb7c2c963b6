"""Prompt-lookup speculative decoding against plain decoding, one stream, on the bundled
model, in one process and one run:

    python bench/speculative.py --out docs/bench/results-speculative.json

Workloads (greedy, single stream):
- code edit: the prompt holds a ~100-line Python file and asks for it back with one
  function renamed, so most of the reply repeats the prompt;
- open chat: a question whose answer repeats nothing (the cost side).

For each, the same engine settings with and without `speculative: {method: ngram}` run
alternately, `--rounds` times; reported: decode tokens/s (first token to last, so the
shared prefill is left out), acceptance (accepted / drafted tokens), tokens emitted per
verify step, and whether both produced the same tokens (they must).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.machine import describe

FUNCTIONS = [
    "area",
    "perimeter",
    "scale",
    "shift",
    "mirror",
    "rotate",
    "clamp",
    "blend",
    "flip",
    "pad",
]


def code_file() -> str:
    """A ~100-line module of small, regular functions (what an agent edits)."""
    lines = ['"""Geometry helpers for rectangles."""', "", "import math", ""]
    for name in FUNCTIONS:
        lines += [
            "",
            f"def {name}(rect, factor=1.0):",
            f'    """Return the {name} of a rectangle, scaled by factor."""',
            "    width = rect.width * factor",
            "    height = rect.height * factor",
            "    if width < 0 or height < 0:",
            f'        raise ValueError("{name}: negative size")',
            f"    result = math.fsum([width, height, {len(name)}])",
            "    return round(result, 3)",
            "",
        ]
    return "\n".join(lines)


WORKLOADS = {
    "code edit": (
        "Here is a Python file:\n\n```python\n{code}\n```\n\nRewrite the whole file, "
        "renaming the function `scale` to `resize`. Change nothing else. Reply with "
        "the complete file only."
    ),
    "open chat": "Write a short story about a lighthouse keeper who finds a map.",
}


async def _run(engine: Any, prompt: list[int], max_tokens: int) -> tuple[list[int], float]:
    from vllm_mlx.engine.types import GenerationRequest, SamplingParams, TokensGenerated

    request = GenerationRequest(f"b{time.monotonic_ns()}", prompt, max_tokens, SamplingParams())
    tokens: list[int] = []
    first = last = 0.0
    async for event in engine.events(request):
        if isinstance(event, TokensGenerated):
            last = time.perf_counter()
            first = first or last
            tokens.extend(event.tokens)
    return tokens, (len(tokens) - 1) / max(last - first, 1e-9)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=400)
    parser.add_argument("--num-tokens", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    from vllm_mlx.models.cpu import blas

    blas.configure("auto")
    from vllm_mlx.config.model import ModelSettings
    from vllm_mlx.engine.engine import Engine
    from vllm_mlx.engine.scheduler import SchedulerConfig
    from vllm_mlx.engine.speculative.config import SpeculativeConfig
    from vllm_mlx.models.loader import load_generation_model

    settings = ModelSettings(name="bench", source="builtin:smollm2-135m-instruct")
    with tempfile.TemporaryDirectory() as cache_dir:
        loaded = load_generation_model(settings, Path(cache_dir))
    spec = SpeculativeConfig(num_tokens=args.num_tokens)
    engines = {
        "plain": Engine(loaded, SchedulerConfig(max_batch_size=16)),
        "ngram": Engine(loaded, SchedulerConfig(max_batch_size=16, speculative=spec)),
    }
    for engine in engines.values():
        engine.start()
    results: dict[str, Any] = {"machine": describe("auto"), "num_tokens": args.num_tokens}
    try:
        for workload, template in WORKLOADS.items():
            text = template.format(code=code_file())
            messages = [{"role": "user", "content": text}]
            prompt = list(
                loaded.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
            )
            row: dict[str, Any] = {"prompt_tokens": len(prompt)}
            outputs: dict[str, list[int]] = {}
            for engine in engines.values():  # warm: the first pass allocates
                asyncio.run(_run(engine, prompt, 16))
            for _ in range(args.rounds):
                for label, engine in engines.items():
                    stats = engine.scheduler.stats
                    before = (stats.drafted_tokens, stats.accepted_tokens, stats.speculative_steps)
                    tokens, speed = asyncio.run(_run(engine, prompt, args.max_tokens))
                    outputs[label] = tokens
                    entry = row.setdefault(label, {"tok_s": [], "tokens": len(tokens)})
                    entry["tok_s"].append(round(speed, 2))
                    drafted = stats.drafted_tokens - before[0]
                    accepted = stats.accepted_tokens - before[1]
                    steps = stats.speculative_steps - before[2]
                    if label == "ngram":
                        entry["drafted"], entry["accepted"] = drafted, accepted
                        entry["acceptance"] = round(accepted / drafted, 3) if drafted else 0.0
                        entry["verify_steps"] = steps
            row["identical"] = outputs["plain"] == outputs["ngram"]
            median = {k: statistics.median(row[k]["tok_s"]) for k in engines}
            row["speedup"] = round(median["ngram"] / median["plain"], 3)
            results[workload] = row
            print(workload, json.dumps(row))
    finally:
        for engine in engines.values():
            engine.stop()
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
