"""Structured outputs: what the grammar mask costs inside the continuous batch.

    python bench/structured.py            # ~2-4 minutes on 2 cores

In-process engine (the daemon's own Engine, BLAS chosen as the daemon does), so mask
times are exact rather than histogram buckets:

- concurrency 16, every request unconstrained vs half of them constrained by a JSON
  schema that cannot end before max_tokens; rounds alternate so load drift on a shared
  machine does not favour one; aggregate tok/s and the ratio;
- per-token mask time (p50/p99/max) over every constrained token;
- compile time of a 50-property nested schema, cold and cached.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CONCURRENCY = 16
NEW_TOKENS = 48
# Never complete within NEW_TOKENS: every constrained request runs to max_tokens.
LONG_SCHEMA = {
    "type": "object",
    "properties": {
        "items": {
            "type": "array",
            "minItems": 40,
            "items": {
                "type": "object",
                "properties": {
                    "id": {"type": "integer", "minimum": 0, "maximum": 999},
                    "tag": {"enum": ["a", "b", "c"]},
                },
                "required": ["id", "tag"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["items"],
    "additionalProperties": False,
}


def wide_schema(properties: int = 50) -> dict[str, Any]:
    """50 properties of mixed kinds, every fifth one a nested object."""
    kinds: list[dict[str, Any]] = [
        {"type": "string", "maxLength": 40},
        {"type": "integer", "minimum": 0, "maximum": 10_000},
        {"type": "number", "minimum": -1.0, "maximum": 1.0},
        {"enum": ["red", "green", "blue", "other"]},
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "pattern": "^[a-z]{2,12}$"},
                "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
                "ok": {"type": "boolean"},
            },
            "required": ["name", "ok"],
            "additionalProperties": False,
        },
    ]
    props = {f"field_{i:02d}": kinds[i % len(kinds)] for i in range(properties)}
    return {
        "type": "object",
        "properties": props,
        "required": list(props)[::2],
        "additionalProperties": False,
    }


def _engine(cache_dir: Path) -> Any:
    from vllm_mlx.models.cpu.blas import configure

    configure()  # before mlx is imported, as the daemon does
    from vllm_mlx.config.model import ModelSettings
    from vllm_mlx.engine.engine import Engine
    from vllm_mlx.engine.scheduler import SchedulerConfig
    from vllm_mlx.models.loader import load_model

    settings = ModelSettings(name="smol", source="builtin:smollm2-135m-instruct")
    engine = Engine(load_model(settings, cache_dir), SchedulerConfig())
    engine.start()
    return engine


async def _round(engine: Any, constrained: int, constraint: Any) -> tuple[int, float]:
    from vllm_mlx.engine.types import GenerationRequest, SamplingParams, TokensGenerated

    async def one(index: int) -> int:
        messages = [{"role": "user", "content": f"List {index} things as JSON."}]
        prompt = list(engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True))
        request = GenerationRequest(
            f"r{time.monotonic_ns()}-{index}",
            prompt,
            NEW_TOKENS,
            SamplingParams(temperature=1.0),
            constraint=constraint if index < constrained else None,
        )
        count = 0
        async for event in engine.events(request):
            if isinstance(event, TokensGenerated):
                count += len(event.tokens)
        return count

    started = time.perf_counter()
    counts = await asyncio.gather(*(one(i) for i in range(CONCURRENCY)))
    return sum(counts), time.perf_counter() - started


def _compile_times(engine: Any) -> dict[str, float]:
    from vllm_mlx.engine.constraints import Constraint

    compiler = engine.constraints
    compiler.tokenizer()  # built once per model; not part of a schema's compile
    started = time.perf_counter()
    first = compiler.compile(Constraint("json_schema", wide_schema()))
    cold = time.perf_counter() - started
    started = time.perf_counter()
    again = compiler.compile(Constraint("json_schema", wide_schema()))  # equal, new dict
    cached = time.perf_counter() - started
    assert again is first
    return {"cold_s": cold, "cached_s": cached}


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    engine = _engine(Path(tempfile.mkdtemp(prefix="vllm-mlx-structured-")))
    from vllm_mlx.engine.constraints import Constraint

    times: list[float] = []
    engine.constraints.observe = times.append
    compiled = engine.constraints.compile(Constraint("json_schema", LONG_SCHEMA))
    constraint = compiled.bind(None)
    asyncio.run(_round(engine, CONCURRENCY // 2, constraint))  # warm-up
    times.clear()
    rates: dict[str, list[float]] = {"unconstrained": [], "half constrained": []}
    for index in range(args.rounds * 2):
        half = index % 2 == (index // 2) % 2  # ABBA order
        tokens, seconds = asyncio.run(_round(engine, CONCURRENCY // 2 if half else 0, constraint))
        rates["half constrained" if half else "unconstrained"].append(tokens / seconds)
    compile_times = _compile_times(engine)
    engine.stop()
    base = statistics.median(rates["unconstrained"])
    half_rate = statistics.median(rates["half constrained"])
    print(f"| case (concurrency {CONCURRENCY}, {NEW_TOKENS} new tokens) | aggregate tok/s |")
    print("| --- | ---: |")
    for name, values in rates.items():
        rounds = ", ".join(f"{v:.1f}" for v in values)
        print(f"| {name} | {statistics.median(values):.1f} (rounds {rounds}) |")
    print(f"\nratio half constrained / unconstrained: **{half_rate / base:.2f}x**")
    print(
        f"mask time per token over {len(times)} tokens: p50 {_pct(times, 0.5) * 1e6:.0f} µs, "
        f"p99 {_pct(times, 0.99) * 1e6:.0f} µs, max {max(times) * 1e6:.0f} µs"
    )
    print(
        f"50-property nested schema: compile {compile_times['cold_s'] * 1e3:.1f} ms, "
        f"cached recompile {compile_times['cached_s'] * 1e6:.0f} µs"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
