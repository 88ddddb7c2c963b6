"""Prefill against the peers, side by side in one run (issue 29).

    python bench/prefill.py --llama-server /path/llama-server --mlx-lm --rounds 2
    python bench/prefill.py --llama-server ... --skip-stall --baseline /other/venv/bin/python

Two scenarios, every server on the bundled model (vllm-mlx and mlx_lm.server on its
mlx-lm directory, llama-server on the GGUF it came from):

- **time to first token** of one request at ~512, ~2k and ~4k prompt tokens, each
  prompt distinct from its first tokens (no server can reuse a cached prefix); the
  servers' order rotates each round so load drift favours none. The reply runs on to
  `--decode-tokens` (48) and its median gap between streamed tokens is the **decode
  speed at that context** (one stream whose attention spans the long prompt: an agent's
  turn);
- **stall**: 8 streams decode; once each has streamed a while, a ~4k-token prompt
  arrives; the streams' gaps between tokens while it is read (p50, p99, max) against
  their median before it, their median while it is read, and the median of a control
  run's gaps at the same token positions (the same streams on the same server, without
  the prompt: a stream's gaps grow with its own context, and the window lasts a minute
  or more), and their median while its reply (up to 64 tokens) decodes beside them; for
  vllm-mlx with prefill pacing (`engine.max_prefill_stall`, the default) and without
  (`null`), and llama-server.

Prints markdown with the raw numbers, the CPU and the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx

from bench.machine import describe, load_average
from bench.peers import (
    PeerSpec,
    float32_directory,
    llama_server_spec,
    mlx_lm_spec,
    model_directory,
    running,
    vllm_mlx_spec,
)
from bench.prompts import TOPICS, _document
from bench.stats import percentile

LENGTHS = (512, 2048, 4096)
# Seeds differ from run to run: no cache kept on disk (a peer's, or ours if a run
# forgets its private cache_dir) can serve a prompt from an earlier run.
RUN = int(time.time()) % 10_000 * 1_000
STREAMS = 8
STREAM_TOKENS = 2000  # more than any stream needs: the streams are cut off at the end
WARM_CHUNKS = 24  # tokens each stream shows before the long prompt arrives
# The long prompt's reply: the streams' gaps while it decodes beside them show what its
# long cache costs them (a batch's attention over the longest row's positions).
LONG_TOKENS = 64


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


def ttft_table(live: list[PeerSpec], rounds: int, decode_tokens: int) -> None:
    print("### Time to first token, one request, distinct prompts\n")
    print("| round | server | prompt tokens | seconds | prompt tok/s | decode ms/token |")
    print("| ---: | --- | ---: | ---: | ---: | ---: |")
    times: dict[tuple[str, int], list[float]] = {}
    gaps: dict[tuple[str, int], list[float]] = {}
    for r in range(rounds):
        shift = r % len(live)
        for spec in live[shift:] + live[:shift]:
            for length in LENGTHS:
                seed = 100 * r + length // 512
                timed = asyncio.run(
                    time_one(spec.base_url, spec.model_id, long_prompt(length, seed), decode_tokens)
                )
                times.setdefault((spec.label, length), []).append(timed.first)
                gap = timed.median_gap_ms()
                if gap is not None:
                    gaps.setdefault((spec.label, length), []).append(gap)
                print(
                    f"| {r + 1} | {spec.label} | {timed.prompt_tokens} | {timed.first:.2f} "
                    f"| {timed.prompt_tokens / timed.first:.0f} "
                    f"| {'-' if gap is None else f'{gap:.1f}'} |",
                    flush=True,
                )
    print()
    decode_ratios(live, gaps)
    first = live[0].label
    for length in LENGTHS:
        ours = statistics.mean(times[(first, length)])
        ratios = ", ".join(
            f"{first} / {spec.label} speed = "
            f"{statistics.mean(times[(spec.label, length)]) / ours:.2f}x"
            for spec in live[1:]
        )
        print(f"- ~{length} tokens (mean of {rounds}): {ratios or 'no peers'}")
    longest, shortest = (
        statistics.mean(times[(first, LENGTHS[-1])]),
        statistics.mean(times[(first, LENGTHS[0])]),
    )
    print(
        f"- {first}: the {LENGTHS[-1]} / {LENGTHS[0]} time ratio is {longest / shortest:.1f}x "
        f"for {LENGTHS[-1] / LENGTHS[0]:.0f}x the tokens\n"
    )


def decode_ratios(live: list[PeerSpec], gaps: dict[tuple[str, int], list[float]]) -> None:
    """Decode speed after each prompt length: our median gap against each peer's."""
    first = live[0].label
    for length in LENGTHS:
        ours = gaps.get((first, length))
        ratios = ", ".join(
            f"{first} / {spec.label} decode speed = "
            f"{statistics.median(gaps[(spec.label, length)]) / statistics.median(ours):.2f}x"
            for spec in live[1:]
            if ours and (spec.label, length) in gaps
        )
        print(f"- decoding after ~{length} tokens (median gaps): {ratios or 'too few tokens'}")


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


def private_cache(work: Path, name: str) -> dict[str, str]:
    """A disk cache for one daemon of this run: no daemon reads another's prompts."""
    return {"cache_dir": str(work / f"cache-{name}")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-server", help="path to llama.cpp's llama-server binary")
    parser.add_argument("--threads", type=int, default=2, help="llama-server -t")
    parser.add_argument("--mlx-lm", action="store_true", help="also mlx_lm.server (float32)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--skip-ttft", action="store_true")
    parser.add_argument("--skip-stall", action="store_true")
    parser.add_argument(
        "--decode-tokens", type=int, default=48, help="tokens each TTFT reply runs to (2: none)"
    )
    parser.add_argument(
        "--baseline", help="python of another checkout's venv: its daemon in both scenarios"
    )
    parser.add_argument(
        "--stall", type=float, nargs="+", default=[3.0, 1.0], help="engine.max_prefill_stall values"
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="vllm-mlx-prefill-"))
    model_dir = model_directory()
    print(f"machine: {json.dumps(describe('auto'))}\n\nload average at start: {load_average()}\n")
    peers: list[PeerSpec] = []
    llama: PeerSpec | None = None
    if args.llama_server:
        from vllm_mlx.models.sources import builtin_path

        gguf = builtin_path("smollm2-135m-instruct")
        llama = llama_server_spec(args.llama_server, gguf, STREAMS + 1, args.threads, 5120)
        peers.append(llama)
    if args.mlx_lm:
        from vllm_mlx.models.cpu import blas

        choice = blas.configure("auto")  # only to hand mlx_lm.server the same BLAS
        f32_dir = float32_directory(model_dir, work.parent / "bench-models")
        peers.append(mlx_lm_spec(f32_dir, "mlx_lm.server (float32)", choice.path))
    for spec in peers:
        if spec.skip:
            print(f"- skipped {spec.label}: {spec.skip}")
    peers = [spec for spec in peers if not spec.skip]
    ours = [vllm_mlx_spec(work, model_dir, "vllm-mlx", paths=private_cache(work, "ttft"))]
    if args.baseline:
        ours.append(
            vllm_mlx_spec(
                work, model_dir, "baseline", paths=private_cache(work, "ttft-baseline"),
                python=args.baseline,
            )
        )  # fmt: skip
    if not args.skip_ttft:
        with ExitStack() as stack:
            live = [stack.enter_context(running(s, work / f"{s.name}-{s.port}.log"))
                    for s in [*ours, *peers]]  # fmt: skip
            ttft_table(live, args.rounds, max(2, args.decode_tokens))
    if not args.skip_stall:
        unpaced = vllm_mlx_spec(
            work, model_dir, "vllm-mlx, max_prefill_stall: null",
            engine={"max_prefill_stall": None}, paths=private_cache(work, "unpaced"),
        )  # fmt: skip
        # This checkout's daemon, and another's (--baseline), at each max_prefill_stall.
        runs = [("vllm-mlx", "paced", sys.executable)]
        runs += [("baseline", "baseline", args.baseline)] if args.baseline else []
        paced = [
            vllm_mlx_spec(
                work,
                model_dir,
                f"{label}, max_prefill_stall: {stall}",
                engine={"max_prefill_stall": stall},
                paths=private_cache(work, f"{tag}-{stall}"),
                python=python,
            )
            for label, tag, python in runs
            for stall in args.stall
        ]
        stall_table(
            [*paced, unpaced, *([llama] if llama and not llama.skip else [])], work, args.rounds
        )
    print(f"load average at end: {load_average()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
