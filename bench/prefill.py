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
- **stall** (bench/prefill_stall.py): 8 streams decode; once each has streamed a while,
  a ~4k-token prompt arrives; the streams' gaps between tokens while it is read (p50,
  p99, max) against their median before it, their median while it is read, and the
  median of a control run's gaps at the same token positions (the same streams on the
  same server, without the prompt: a stream's gaps grow with its own context, and the
  window lasts a minute or more), and their median while its reply (up to 64 tokens)
  decodes beside them; for vllm-mlx with prefill pacing (`engine.max_prefill_stall`, the
  default) and without (`null`), and llama-server.

Prints markdown with the raw numbers, the CPU and the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


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
from bench.prefill_requests import LENGTHS, long_prompt, time_one
from bench.prefill_stall import STREAMS, stall_table


def ttft_table(live: list[PeerSpec], rounds: int, decode_tokens: int) -> None:
    print("### Time to first token, one request, distinct prompts\n")
    print("| round | server | prompt tokens | seconds | prompt tok/s | decode ms/token |")
    print("| ---: | --- | ---: | ---: | ---: | ---: |")
    times: dict[tuple[str, int], list[float]] = {}
    prompt_tokens: dict[tuple[str, int], list[int]] = {}
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
                prompt_tokens.setdefault((spec.label, length), []).append(timed.prompt_tokens)
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
    tokens = [
        long / short
        for long, short in zip(
            prompt_tokens[(first, LENGTHS[-1])], prompt_tokens[(first, LENGTHS[0])], strict=True
        )
    ]
    for length in LENGTHS:
        ours = statistics.mean(times[(first, length)])
        ratios = ", ".join(
            f"{first} / {spec.label} speed = "
            f"{statistics.mean(times[(spec.label, length)]) / ours:.2f}x"
            for spec in live[1:]
        )
        print(f"- ~{length} tokens (mean of {rounds}): {ratios or 'no peers'}")
    near_linear(first, times[(first, LENGTHS[-1])], times[(first, LENGTHS[0])], tokens)


def near_linear(
    label: str, longest: list[float], shortest: list[float], tokens: list[float]
) -> None:
    """The near-linear goal's figure: the longest prompt's time over the shortest's, by
    means and by medians (the shortest prompt's first token, ~1 s, varies 10-50% from
    round to round here, and a mean follows one slow round), and per round over that
    round's token ratio."""
    by_round = ", ".join(f"{long / short / ratio:.2f}x" for long, short, ratio in
                         zip(longest, shortest, tokens, strict=True))  # fmt: skip
    print(
        f"- {label}: the {LENGTHS[-1]} / {LENGTHS[0]} time ratio is "
        f"{statistics.mean(longest) / statistics.mean(shortest):.1f}x (means), "
        f"{statistics.median(longest) / statistics.median(shortest):.1f}x (medians) for "
        f"{statistics.mean(tokens):.1f}x the tokens; per round, over its token ratio: {by_round}\n"
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
