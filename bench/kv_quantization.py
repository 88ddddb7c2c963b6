"""The live KV cache quantized (a model's `kv_cache.bits`) against full precision, on the
bundled model, in one process and one run:

    python bench/kv_quantization.py --prompts 50 --out docs/bench/results-kv-quantization.json

For full precision and each of 8 and 4 bits (group 64 and 32) it reports:
- KV bytes per token, and what a 1 GiB KV budget holds (tokens; 2,048-token contexts);
- perplexity over a fixed English text (engine/cache/perplexity.py: fed in 64-token
  chunks, each attending to the earlier chunks' cache in its stored form);
- greedy agreement with full precision over `--prompts` chat prompts (the same first 32
  tokens: whole outputs identical, and the mean shared prefix);
- decode tokens/s at concurrency 1 and 16 (the engine's continuous batch; settings
  alternate, best of `--rounds`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.machine import describe
from bench.prompts import TOPICS

SETTINGS: list[tuple[str, int | None, int]] = [
    ("full", None, 64),
    ("8-bit g64", 8, 64),
    ("8-bit g32", 8, 32),
    ("4-bit g64", 4, 64),
    ("4-bit g32", 4, 32),
]
BUDGET = 2**30
CONTEXT = 2048
ASKS = ("Write a short story about", "Explain in three sentences", "List five facts about")


def _prompts(n: int) -> list[str]:
    return [f"{ASKS[i % len(ASKS)]} {TOPICS[i % len(TOPICS)]} (#{i})." for i in range(n)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    from vllm_mlx.models.cpu import blas

    blas.configure("auto")
    from vllm_mlx.config.kv_cache import KVCacheSettings
    from vllm_mlx.config.model import ModelSettings
    from vllm_mlx.engine.cache.perplexity import REFERENCE_TEXT, perplexity
    from vllm_mlx.engine.cache.rows import KVQuantization
    from vllm_mlx.engine.engine import Engine
    from vllm_mlx.engine.fleet.sizes import kv_bytes_per_token, probe_kv_itemsize
    from vllm_mlx.engine.scheduler import SchedulerConfig
    from vllm_mlx.engine.scheduler_state import with_kv_cache
    from vllm_mlx.models.loader import load_generation_model

    model_settings = ModelSettings(name="bench", source="builtin:smollm2-135m-instruct")
    with tempfile.TemporaryDirectory() as cache_dir:
        loaded = load_generation_model(model_settings, Path(cache_dir))
    engines: dict[str, Engine] = {}
    for label, bits, group in SETTINGS:
        config = with_kv_cache(
            SchedulerConfig(max_batch_size=16),
            KVCacheSettings(bits=bits, group_size=group),  # type: ignore[arg-type]
            loaded.model,
        )
        engines[label] = Engine(loaded, config)
        engines[label].start()
    text_tokens = list(loaded.tokenizer.encode(REFERENCE_TEXT))
    itemsize = probe_kv_itemsize(loaded.model)
    prompts = _prompts(args.prompts)
    rows: dict[str, dict[str, Any]] = {}
    for label, bits, group in SETTINGS:
        per_token = kv_bytes_per_token(loaded.model, bits, group, itemsize)
        quant = None if bits is None else KVQuantization(bits, group)
        rows[label] = {
            "bytes_per_token": per_token,
            "tokens_in_1gib": BUDGET // per_token,
            "contexts_2048_in_1gib": BUDGET // per_token // CONTEXT,
            "perplexity": round(perplexity(loaded.model, text_tokens, quant), 4),
        }
        print(label, rows[label], flush=True)
    outputs = {label: _greedy(engines[label], prompts, 32) for label, _, _ in SETTINGS}
    for label, _, _ in SETTINGS:
        same = [a == b for a, b in zip(outputs[label], outputs["full"], strict=True)]
        shared = [_shared(a, b) for a, b in zip(outputs[label], outputs["full"], strict=True)]
        rows[label]["greedy_identical"] = f"{sum(same)}/{len(same)}"
        rows[label]["greedy_mean_shared_prefix"] = round(sum(shared) / len(shared), 2)
    for concurrency, tokens in ((1, 128), (16, 64)):
        key = f"decode_tok_s_c{concurrency}"
        for _ in range(args.rounds):
            for label, _, _ in SETTINGS:  # alternating: load drifts affect all alike
                speed = _decode_speed(engines[label], prompts[:concurrency], tokens)
                rows[label][key] = max(rows[label].get(key, 0.0), round(speed, 2))
    for label in rows:
        full = rows["full"]
        for c in (1, 16):
            key = f"decode_tok_s_c{c}"
            rows[label][f"decode_ratio_c{c}"] = round(rows[label][key] / full[key], 3)
        print(label, rows[label], flush=True)
    for engine in engines.values():
        engine.stop()
    result = {"machine": describe("auto"), "settings": rows, "prompts": len(prompts)}
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


def _shared(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _request(engine: Any, rid: str, text: str, max_tokens: int) -> Any:
    from vllm_mlx.engine.types import GenerationRequest, SamplingParams

    messages = [{"role": "user", "content": text}]
    tokens = list(engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True))
    return GenerationRequest(rid, tokens, max_tokens, SamplingParams(temperature=0.0))


async def _tokens(engine: Any, request: Any) -> list[int]:
    from vllm_mlx.engine.types import SequenceFinished, TokensGenerated

    out: list[int] = []
    async for event in engine.events(request):
        if isinstance(event, TokensGenerated):
            out.extend(event.tokens)
        elif isinstance(event, SequenceFinished):
            break
    return out


def _greedy(engine: Any, prompts: list[str], max_tokens: int) -> list[list[int]]:
    async def run() -> list[list[int]]:
        requests = [_request(engine, f"g{i}", p, max_tokens) for i, p in enumerate(prompts)]
        return list(await asyncio.gather(*(_tokens(engine, r) for r in requests)))

    return asyncio.run(run())


def _decode_speed(engine: Any, prompts: list[str], max_tokens: int) -> float:
    """Generated tokens per second over the whole run, after every prompt's first token."""

    async def run() -> float:
        requests = [_request(engine, f"d{i}", p, max_tokens) for i, p in enumerate(prompts)]
        first: list[float] = []
        arrivals: list[tuple[float, int]] = []

        async def one(request: Any) -> None:
            from vllm_mlx.engine.types import SequenceFinished, TokensGenerated

            async for event in engine.events(request):
                if isinstance(event, TokensGenerated):
                    now = time.perf_counter()
                    arrivals.append((now, len(event.tokens)))
                    if len(first) < len(requests) and request.request_id not in seen:
                        seen.add(request.request_id)
                        first.append(now)
                elif isinstance(event, SequenceFinished):
                    break

        seen: set[str] = set()
        await asyncio.gather(*(one(r) for r in requests))
        start = max(first)  # every stream decoding: the steady state
        after = [(t, n) for t, n in arrivals if t > start]
        return sum(n for _, n in after) / (after[-1][0] - start) if after else 0.0

    return asyncio.run(run())


if __name__ == "__main__":
    raise SystemExit(main())
