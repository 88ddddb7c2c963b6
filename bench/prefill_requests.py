"""What bench/prefill.py's scenarios send: distinct long prompts, and one streamed request
timed (its first token, its last, the gaps between)."""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass

import httpx

from bench.prompts import _document

LENGTHS = (512, 2048, 4096)
# Seeds differ from run to run: no cache kept on disk (a peer's, or ours if a run
# forgets its private cache_dir) can serve a prompt from an earlier run.
RUN = int(time.time()) % 10_000 * 1_000


def long_prompt(tokens: int, seed: int) -> list[dict[str, str]]:
    """About `tokens` prompt tokens; the run and the seed lead the prompt, so no two
    prompts share more than the chat template's first few tokens."""
    report = _document(tokens - 40, seed % 1000)
    return [
        {"role": "system", "content": f"Session {RUN + seed}: you summarise reports."},
        {"role": "user", "content": f"{report}\n\nSummarise the report above in one line."},
    ]


@dataclass
class Timed:
    first: float  # seconds to the first streamed token
    done: float  # seconds to the last chunk
    prompt_tokens: int  # as the server counted them
    token_times: list[float]  # perf_counter of every chunk with content

    def median_gap_ms(self) -> float | None:
        """The median gap between streamed tokens (None under 8 gaps: an early stop)."""
        gaps = [b - a for a, b in zip(self.token_times, self.token_times[1:], strict=False)]
        return statistics.median(gaps) * 1000 if len(gaps) >= 8 else None


async def time_one(
    base_url: str, model: str, messages: list[dict[str, str]], max_tokens: int = 2
) -> Timed:
    """One streamed request, timed. Two tokens by default: with one, a server may end the
    request (store its cache) before it sends the token."""
    body = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    first, counted, token_times = None, 0, []
    async with httpx.AsyncClient(timeout=900) as client:
        started = time.perf_counter()
        async with client.stream("POST", f"{base_url}/v1/chat/completions", json=body) as reply:
            reply.raise_for_status()
            async for line in reply.aiter_lines():
                if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                    continue
                chunk = json.loads(line[5:])
                if any((c.get("delta") or {}).get("content") for c in chunk.get("choices") or ()):
                    token_times.append(time.perf_counter())
                    first = token_times[0] - started
                if chunk.get("usage"):
                    counted = int(chunk["usage"]["prompt_tokens"])
        done = time.perf_counter() - started
    if first is None:
        raise RuntimeError(f"{base_url}: no token streamed")
    return Timed(first, done, counted, token_times)
