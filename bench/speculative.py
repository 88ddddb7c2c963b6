"""Speculative decoding against plain decoding on the bundled model, in one process and
one run:

    python bench/speculative.py --out docs/bench/results-speculative.json
    python bench/speculative.py --lines 300 --workloads "code edit" summarise
    python bench/speculative.py --concurrency 16 --workloads "code edit" "open chat"
    python bench/speculative.py --temperature 0.3 --seed 7   # sampled, seeded
    python bench/speculative.py --method self-draft --force   # the draft mechanism
    python bench/speculative.py --method random-draft         # a bad draft's cost
    python bench/speculative.py --method prediction           # Predicted Outputs

Methods: `ngram` (prompt lookup, the default); `self-draft`, the bundled model drafting
for itself (acceptance near 100% greedy: the mechanism, not a speed-up, since the draft
costs what the target does); `random-draft`, a random 2-layer llama with the bundled
tokenizer (tests/support/tiny_model.py; acceptance near 0: what a bad draft costs).
`prediction`: no speculative section; each request carries a Predicted Outputs
`prediction`, the plain engine's reply of the same round with every 25th token changed
(a file given back with small edits). `--force` checks every proposal (the plan's
costs set to 0) instead of letting the plan decide which passes pay.

Workloads:
- code edit: the prompt holds a Python file of `--lines` lines (~100 by default) and asks
  for it back with one function renamed, so most of the reply repeats the prompt;
- summarise: a report and a request to summarise it quoting its key sentences (RAG
  answers that quote);
- open chat: a question whose answer repeats nothing (the cost side).

For each, the same engine settings with and without the `speculative` section run
alternately, `--rounds` times; reported: decode tokens/s (first token to last, so the
shared prefill is left out; with `--concurrency` N requests at once, the aggregate from
the first first token to the last token), acceptance (accepted / drafted tokens), verify
steps, and whether both produced the same tokens (greedy: they must; seeded sampling:
they do whenever the logits are bit-identical, which batch 1 guarantees).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from dataclasses import replace
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


def code_file(lines: int = 100) -> str:
    """A module of about `lines` lines of small, regular functions (what an agent edits)."""
    out = ['"""Geometry helpers for rectangles."""', "", "import math", ""]
    i = 0
    while len(out) < lines:
        name = FUNCTIONS[i % len(FUNCTIONS)] + (f"_{i // len(FUNCTIONS)}" if i >= 10 else "")
        out += [
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
        i += 1
    return "\n".join(out)


def report() -> str:
    """A ~600-token maintenance report (bench/prompts.py's document)."""
    from bench.prompts import _document

    return _document(600, 3)


WORKLOADS = {
    "code edit": (
        "Here is a Python file:\n\n```python\n{code}\n```\n\nRewrite the whole file, "
        "renaming the function `scale` to `resize`. Change nothing else. Reply with "
        "the complete file only."
    ),
    "summarise": (
        "Here is a report:\n\n{report}\n\nSummarise the report for the committee, "
        "quoting its most important sentences word for word."
    ),
    "open chat": "Write a short story about a lighthouse keeper who finds a map.",
}


async def _run(
    engine: Any, prompt: list[int], max_tokens: int, sampling: Any, prediction: tuple[int, ...]
) -> tuple[list[int], float, float]:
    """The tokens, and the times of the first and the last."""
    from vllm_mlx.engine.types import GenerationRequest, TokensGenerated

    request = GenerationRequest(
        f"b{time.monotonic_ns()}", prompt, max_tokens, sampling, prediction=prediction
    )
    tokens: list[int] = []
    first = last = 0.0
    async for event in engine.events(request):
        if isinstance(event, TokensGenerated):
            last = time.perf_counter()
            first = first or last
            tokens.extend(event.tokens)
    return tokens, first, last


async def _batch(
    engine: Any,
    prompts: list[list[int]],
    max_tokens: int,
    sampling: Any,
    predictions: list[tuple[int, ...]] | None = None,
) -> tuple[list[list[int]], float]:
    """Every prompt at once: each one's tokens, and the decode tok/s of them all."""
    predicted = predictions or [()] * len(prompts)
    runs = await asyncio.gather(
        *(_run(engine, p, max_tokens, sampling, d) for p, d in zip(prompts, predicted, strict=True))
    )
    total = sum(len(tokens) - 1 for tokens, _, _ in runs)
    span = max(last for _, _, last in runs) - min(first for _, first, _ in runs)
    return [tokens for tokens, _, _ in runs], total / max(span, 1e-9)


def prompts_for(tokenizer: Any, template: str, lines: int, concurrency: int) -> list[list[int]]:
    """`concurrency` prompts of one workload, each distinct (request i, at the start)."""
    text = template.format(code=code_file(lines), report=report())
    out = []
    for i in range(concurrency):
        head = f"Request {i}. " if concurrency > 1 else ""
        messages = [{"role": "user", "content": head + text}]
        out.append(list(tokenizer.apply_chat_template(messages, add_generation_prompt=True)))
    return out


def edited(tokens: list[int]) -> tuple[int, ...]:
    """A prediction close to `tokens`: every 25th token changed (small edits)."""
    return tuple(t + 1 if i % 25 == 24 else t for i, t in enumerate(tokens))


def _draft(method: str, settings: Any, cache_dir: Path) -> Any:
    """The draft model a method uses (None for prompt lookup)."""
    from vllm_mlx.models.loader import load_generation_model

    if method == "self-draft":
        return load_generation_model(settings, cache_dir)
    if method == "random-draft":
        from tests.support.tiny_model import bundled_tokenizer_dir, make_tiny_model

        tiny = make_tiny_model(cache_dir / "tiny", bundled_tokenizer_dir(cache_dir), "llama", 7)
        return load_generation_model(settings.model_copy(update={"source": str(tiny)}), cache_dir)
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=400)
    parser.add_argument("--num-tokens", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--lines", type=int, default=100, help="the code edit's file length")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    methods = ["ngram", "self-draft", "random-draft", "prediction"]
    parser.add_argument("--method", default="ngram", choices=methods)
    parser.add_argument("--force", action="store_true", help="check every proposal")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    from vllm_mlx.models.cpu import blas

    blas.configure("auto")
    from vllm_mlx.config.model import ModelSettings
    from vllm_mlx.engine.engine import Engine
    from vllm_mlx.engine.scheduler import SchedulerConfig
    from vllm_mlx.engine.speculative.config import SpeculativeConfig
    from vllm_mlx.engine.types import SamplingParams
    from vllm_mlx.models.loader import load_generation_model

    settings = ModelSettings(name="bench", source="builtin:smollm2-135m-instruct")
    with tempfile.TemporaryDirectory() as cache_dir:
        loaded = load_generation_model(settings, Path(cache_dir))
        drafting = replace(loaded, draft=_draft(args.method, settings, Path(cache_dir)))
    method = "ngram" if args.method == "ngram" else "draft"
    spec = SpeculativeConfig(num_tokens=args.num_tokens, method=method)
    if args.force:
        spec = replace(spec, position_cost=0.0, draft_cost=0.0)
    batch = max(16, args.concurrency)
    section = None if args.method == "prediction" else spec
    engines = {
        "plain": Engine(loaded, SchedulerConfig(max_batch_size=batch)),
        "spec": Engine(drafting, SchedulerConfig(max_batch_size=batch, speculative=section)),
    }
    sampling = SamplingParams(temperature=args.temperature, seed=args.seed)
    for engine in engines.values():
        engine.start()
    results: dict[str, Any] = {
        "machine": describe("auto"),
        "method": args.method,
        "force": args.force,
        "num_tokens": args.num_tokens,
        "concurrency": args.concurrency,
        "temperature": args.temperature,
        "seed": args.seed,
    }
    try:
        for workload in args.workloads:
            prompts = prompts_for(
                loaded.tokenizer, WORKLOADS[workload], args.lines, args.concurrency
            )
            row: dict[str, Any] = {"prompt_tokens": len(prompts[0])}
            outputs: dict[str, list[list[int]]] = {}
            for engine in engines.values():  # warm: the first pass allocates
                asyncio.run(_batch(engine, prompts[:1], 16, sampling))
            for _ in range(args.rounds):
                for label, engine in engines.items():
                    stats = engine.scheduler.stats
                    before = (stats.drafted_tokens, stats.accepted_tokens, stats.speculative_steps)
                    predictions = None
                    if label == "spec" and args.method == "prediction":
                        predictions = [edited(t) for t in outputs["plain"]]
                    run = _batch(engine, prompts, args.max_tokens, sampling, predictions)
                    tokens, speed = asyncio.run(run)
                    outputs[label] = tokens
                    count = sum(len(t) for t in tokens)
                    entry = row.setdefault(label, {"tok_s": [], "tokens": count})
                    entry["tok_s"].append(round(speed, 2))
                    drafted = stats.drafted_tokens - before[0]
                    accepted = stats.accepted_tokens - before[1]
                    steps = stats.speculative_steps - before[2]
                    if label == "spec":
                        entry["drafted"], entry["accepted"] = drafted, accepted
                        entry["acceptance"] = round(accepted / drafted, 3) if drafted else 0.0
                        entry["verify_steps"] = steps
            row["identical"] = outputs["plain"] == outputs["spec"]
            median = {k: statistics.median(row[k]["tok_s"]) for k in engines}
            row["speedup"] = round(median["spec"] / median["plain"], 3)
            results[workload] = row
            print(workload, json.dumps(row), flush=True)
    finally:
        for engine in engines.values():
            engine.stop()
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
