"""The request path of this checkout against another's, side by side in one run.

    python bench/pipeline.py --baseline /path/to/other/checkout/.venv/bin/python

Two daemons on the bundled model with the same settings: this checkout's and the one
the other interpreter imports. After one uncounted warm-up round, each round runs, for
every daemon in a rotating order (so load drift favours neither), single-stream chat
(time to first token: the request path's own cost of parse, resolve, template,
tokenise, first step) and 16 concurrent streams (aggregate tok/s). Prints markdown:
every round, then the mean ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.loadgen import Scenario, run_scenario, warm_up
from bench.machine import load_average
from bench.peers import model_directory, running, vllm_mlx_spec
from bench.prompts import PROMPT_SETS
from bench.stats import summarize

CASES = ((1, 8, 32), (16, 1, 64))  # (concurrency, requests per client, new tokens)


def cpu_name() -> str:
    """The CPU's model name, with its family and model (a VM may hide the marketing name)."""
    info = Path("/proc/cpuinfo")
    if not info.exists():
        return platform.processor() or platform.machine()
    fields: dict[str, str] = {}
    for line in info.read_text().splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    cores = sum(1 for line in info.read_text().splitlines() if line.startswith("processor"))
    return (
        f"{fields.get('model name', '?')} (family {fields.get('cpu family', '?')}, "
        f"model {fields.get('model', '?')}), {cores} logical CPUs"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, help="python that imports the other checkout")
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    model_dir = model_directory()
    print(f"CPU: {cpu_name()}; load average at start: {load_average()}\n")
    print("| round | concurrency | path | TTFT p50 s | aggregate tok/s | errors |")
    print("| ---: | ---: | --- | ---: | ---: | ---: |")
    ttft: dict[str, list[float]] = {}
    tok_s: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        work = Path(tmp)
        specs = [
            vllm_mlx_spec(work, model_dir, "after"),
            vllm_mlx_spec(work, model_dir, "before", python=args.baseline),
        ]
        live = [stack.enter_context(running(s, work / f"{s.label}.log")) for s in specs]
        for round_no in range(-1, args.rounds):  # round -1 warms both up, uncounted
            order = live[round_no % 2 :] + live[: round_no % 2]
            for concurrency, per_client, new_tokens in CASES:
                scenario = Scenario(
                    PROMPT_SETS["short"], concurrency, per_client, new_tokens, 900.0
                )
                for spec in order:
                    asyncio.run(warm_up(spec.base_url, spec.model_id, scenario))
                    s = summarize(asyncio.run(run_scenario(spec.base_url, spec.model_id, scenario)))
                    if round_no < 0:
                        continue
                    if concurrency == 1:
                        ttft.setdefault(spec.label, []).append(s.ttft_s.p50)
                    else:
                        tok_s.setdefault(spec.label, []).append(s.aggregate_tok_s)
                    print(
                        f"| {round_no + 1} | {concurrency} | {spec.label} | {s.ttft_s.p50:.3f} "
                        f"| {s.aggregate_tok_s:.1f} | {s.errors} |",
                        flush=True,
                    )
    print(f"\nload average at end: {load_average()}")

    def mean(values: list[float]) -> float:
        return sum(values) / len(values)

    print(
        f"- c=1 TTFT p50, mean of {args.rounds} rounds: after {mean(ttft['after']):.3f} s, "
        f"before {mean(ttft['before']):.3f} s: after/before = "
        f"{mean(ttft['after']) / mean(ttft['before']):.3f}x"
    )
    print(
        f"- c=16 aggregate, mean of {args.rounds} rounds: after {mean(tok_s['after']):.1f}, "
        f"before {mean(tok_s['before']):.1f} tok/s: after/before = "
        f"{mean(tok_s['after']) / mean(tok_s['before']):.3f}x"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
