"""OpenAI `n` and `logprobs`: what they cost, side by side on one daemon.

    python bench/openai_extras.py          # ~3 minutes on 2 cores

1. TTFT of n=4 against n=1 on a ~500-token prompt (each trial's prompt is distinct and
   the prefix cache is off, so nothing is reused across trials): n=4 prefills once.
2. Decode tok/s at concurrency 8 with `logprobs: true, top_logprobs: 5` against off.
Trials alternate between the two arms so load drift does not favour one; the ratios are
what to read on a shared machine.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.peers import model_directory, running, vllm_mlx_spec
from bench.prompts import _document

TTFT_TRIALS = 6
DECODE_ROUNDS = 3
DECODE_TOKENS = 48
CONCURRENCY = 8


async def stream(client: httpx.AsyncClient, body: dict[str, Any]) -> tuple[float, float, int]:
    """(time to the first content token, decode tok/s of the slowest choice, tokens)."""
    started = time.monotonic()
    first: float | None = None
    times: dict[int, list[float]] = {}
    tokens = 0
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            payload = json.loads(line[6:])
            if payload.get("usage"):
                tokens = payload["usage"]["completion_tokens"]
            for choice in payload.get("choices", []):
                if choice["delta"].get("content"):
                    now = time.monotonic()
                    first = now if first is None else first
                    times.setdefault(choice["index"], []).append(now)
    assert first is not None, "no content"
    rates = [(len(t) - 1) / (t[-1] - t[0]) for t in times.values() if len(t) > 1 and t[-1] > t[0]]
    return first - started, min(rates) if rates else 0.0, tokens


def chat(model: str, content: str, max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0.7,
        "seed": 1,
        "stream": True,
        "stream_options": {"include_usage": True},
        **extra,
    }


async def ttft(base_url: str, model: str) -> dict[int, list[float]]:
    out: dict[int, list[float]] = {1: [], 4: []}
    async with httpx.AsyncClient(base_url=base_url, timeout=600) as client:
        await stream(client, chat(model, _document(480, 999), 2))  # warm up
        for trial in range(TTFT_TRIALS):
            for n in (1, 4) if trial % 2 == 0 else (4, 1):
                prompt = f"Trial {trial} n {n}. " + _document(480, trial * 10 + n)
                seconds, _, _ = await stream(client, chat(model, prompt + "\nSummarize.", 4, n=n))
                out[n].append(seconds)
    return out


async def decode(base_url: str, model: str) -> dict[bool, list[float]]:
    out: dict[bool, list[float]] = {False: [], True: []}
    async with httpx.AsyncClient(base_url=base_url, timeout=600) as client:
        for round_ in range(DECODE_ROUNDS):
            for on in (False, True) if round_ % 2 == 0 else (True, False):
                extra = {"logprobs": True, "top_logprobs": 5} if on else {}
                bodies = [
                    chat(
                        model, f"Round {round_} client {i}: write a story.", DECODE_TOKENS, **extra
                    )
                    for i in range(CONCURRENCY)
                ]
                started = time.monotonic()
                results = await asyncio.gather(*(stream(client, b) for b in bodies))
                elapsed = time.monotonic() - started
                out[on].append(sum(r[2] for r in results) / elapsed)
    return out


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="vllm-mlx-openai-"))
    spec = vllm_mlx_spec(work, model_directory(), "vllm-mlx", {"cache_memory_mb": 0})
    with running(spec, work / "daemon.log") as server:
        firsts = asyncio.run(ttft(server.base_url, server.model_id))
        rates = asyncio.run(decode(server.base_url, server.model_id))
    one, four = statistics.median(firsts[1]), statistics.median(firsts[4])
    off, on = statistics.median(rates[False]), statistics.median(rates[True])
    print("| measure | off / n=1 | on / n=4 | ratio |")
    print("| --- | ---: | ---: | ---: |")
    print(
        f"| TTFT p50, ~500-token prompt, n=1 vs n=4 | {one:.2f} s | {four:.2f} s "
        f"| {four / one:.2f} |"
    )
    print(
        f"| aggregate tok/s, concurrency 8, logprobs off vs on | {off:.1f} | {on:.1f} "
        f"| {on / off:.2f} |"
    )
    print(f"raw TTFT n=1 {firsts[1]}\nraw TTFT n=4 {firsts[4]}\nraw tok/s {rates}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
