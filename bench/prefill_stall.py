"""bench/prefill.py's stall scenario: 8 streams decode, a ~4k-token prompt arrives, and
the streams' gaps while it is read are set against their gaps at the same tokens in a
control run without it (see bench/prefill.py)."""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.peers import PeerSpec, running
from bench.prefill_requests import LENGTHS, long_prompt, time_one
from bench.prompts import TOPICS
from bench.stats import percentile

STREAMS = 8
STREAM_TOKENS = 2000  # more than any stream needs: the streams are cut off at the end
WARM_CHUNKS = 24  # tokens each stream shows before the long prompt arrives
# The long prompt's reply: the streams' gaps while it decodes beside them show what its
# long cache costs them (a batch's attention over the longest row's positions).
LONG_TOKENS = 64


@dataclass
class Stream:
    chunk_times: list[float] = field(default_factory=list)
    error: str | None = None


async def stream_into(client: httpx.AsyncClient, spec: PeerSpec, index: int, into: Stream) -> None:
    body: dict[str, Any] = {
        "model": spec.model_id,
        "messages": [
            {
                "role": "user",
                "content": f"Stream {index}: write a long story about "
                f"{TOPICS[index % len(TOPICS)]}.",
            },
        ],
        "max_tokens": STREAM_TOKENS,
        "temperature": 0,
        "stream": True,
    }
    try:
        async with client.stream("POST", f"{spec.base_url}/v1/chat/completions", json=body) as r:
            async for line in r.aiter_lines():
                if line.startswith("data:") and line[5:].strip() != "[DONE]":
                    choices = json.loads(line[5:]).get("choices") or [{}]
                    if (choices[0].get("delta") or {}).get("content"):
                        into.chunk_times.append(time.perf_counter())
    except httpx.HTTPError as exc:
        into.error = f"{type(exc).__name__}: {exc}"


@dataclass
class StreamsRun:
    streams: list[Stream]
    # When the long prompt arrived, its first token came and its reply was done (0
    # without one), and its tokens as the server counted them.
    arrived: float = 0.0
    read: float = 0.0
    decoded: float = 0.0
    prompt_tokens: int = 0


async def run_streams(
    spec: PeerSpec, seed: int, long: tuple[int, int] | None, until: list[int] | None = None
) -> StreamsRun:
    """STREAMS streams decode; with `long` (prompt tokens, seed) its prompt arrives once
    each has streamed WARM_CHUNKS, and they stop when its reply is done; without, they
    stop when stream i has `until[i]` chunks."""
    streams = [Stream() for _ in range(STREAMS)]
    async with httpx.AsyncClient(timeout=900) as client:
        tasks = [
            asyncio.create_task(stream_into(client, spec, 50 * seed + i, s))
            for i, s in enumerate(streams)
        ]
        goal = until or [WARM_CHUNKS] * STREAMS
        while any(len(s.chunk_times) < n for s, n in zip(streams, goal, strict=True)):
            if any(t.done() for t in tasks):
                raise RuntimeError(f"{spec.label}: a stream ended early")
            await asyncio.sleep(0.05)  # polling a condition on the streams, not timing
        run = StreamsRun(streams)
        if long is not None:
            run.arrived = time.perf_counter()
            timed = await time_one(
                spec.base_url, spec.model_id, long_prompt(long[0], long[1]), LONG_TOKENS
            )
            run.read, run.decoded = run.arrived + timed.first, run.arrived + timed.done
            run.prompt_tokens = timed.prompt_tokens
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return run


async def stall(spec: PeerSpec, length: int, seed: int) -> dict[str, float]:
    """The stall scenario, then its control: the same streams (same prompts, greedy: the
    same tokens) on the same server without the long prompt, to the token each reached.
    A stream's gaps grow with its own context, and while a long prompt is read in small
    chunks the streams go on for a minute or more: the control's gaps at the very token
    positions that fell in the window are what those gaps would have been without it."""
    run = await run_streams(spec, seed, (length, seed))
    arrived, read, decoded = run.arrived, run.read, run.decoded
    before, during, beside = [], [], []
    window: list[set[int]] = []  # each stream's gap positions while the prompt was read
    for s in run.streams:
        window.append(set())
        for i, (a, b) in enumerate(zip(s.chunk_times, s.chunk_times[1:], strict=False)):
            if b <= arrived:
                before.append(b - a)
            elif b <= read:
                during.append(b - a)
                window[-1].add(i)
            elif a >= read and b <= decoded:
                beside.append(b - a)
    reached = [max(w, default=0) + 2 for w in window]
    alone = await run_streams(spec, seed, None, until=reached)
    control = [
        b - a
        for s, w in zip(alone.streams, window, strict=True)
        for i, (a, b) in enumerate(zip(s.chunk_times, s.chunk_times[1:], strict=False))
        if i in w
    ]
    usual = statistics.median(before)
    return {
        "prompt_tokens": float(run.prompt_tokens),
        "ttft": read - arrived,
        "usual": usual,
        "usual_p99": percentile(before, 99),
        "p50": percentile(during, 50),
        "p99": percentile(during, 99),
        "max": max(during) if during else float("nan"),
        "gaps": len(during),
        # the same streams at the same tokens without the long prompt
        "control_p50": percentile(control, 50),
        "control_p99": percentile(control, 99),
        # while the long prompt's own tokens are decoded beside the streams
        "beside_p50": percentile(beside, 50) if beside else float("nan"),
        "beside_gaps": len(beside),
    }


def stall_table(specs: list[PeerSpec], work: Path, rounds: int) -> None:
    print(f"### {STREAMS} streams decoding while a ~{LENGTHS[-1]}-token prompt is read\n")
    print(
        "| round | server | prompt tokens | its TTFT s | streams' gap before, median / p99 ms "
        "| gap while read p50 / p99 / max ms | p99 / median before | p99 / median while read "
        "| same tokens without the prompt, median / p99 ms | **p99 / that median** "
        "| gaps | gap while it decodes p50 ms (gaps) | that / median before |"
    )
    print(
        "| ---: | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    )
    for r in range(rounds):
        shift = r % len(specs)
        for spec in specs[shift:] + specs[:shift]:
            with running(spec, work / f"stall-{spec.name}-{spec.port}-{r}.log") as live:
                row = asyncio.run(stall(live, LENGTHS[-1], 900 + r))
            print(
                f"| {r + 1} | {spec.label} | {row['prompt_tokens']:.0f} | {row['ttft']:.1f} "
                f"| {1000 * row['usual']:.0f} / {1000 * row['usual_p99']:.0f} "
                f"| {1000 * row['p50']:.0f} / "
                f"{1000 * row['p99']:.0f} / {1000 * row['max']:.0f} "
                f"| {row['p99'] / row['usual']:.1f}x | {row['p99'] / row['p50']:.1f}x "
                f"| {1000 * row['control_p50']:.0f} / {1000 * row['control_p99']:.0f} "
                f"| **{row['p99'] / row['control_p50']:.1f}x** "
                f"| {row['gaps']:.0f} "
                f"| {1000 * row['beside_p50']:.0f} ({row['beside_gaps']:.0f}) "
                f"| {row['beside_p50'] / row['usual']:.1f}x |",
                flush=True,
            )
    print()
