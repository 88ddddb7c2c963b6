"""/api/chat (Ollama) against /v1/chat/completions (OpenAI) on one daemon, in one run.

    python bench/protocols.py --rounds 6

Both protocols run over the same pipeline and engine, so their throughput should agree:
this measures the adapters' own cost. One daemon on the bundled model; after an uncounted
warm-up round, each round runs both protocols in a rotating order at concurrency 1 (TTFT,
decode tok/s) and 16 (aggregate tok/s). Prints markdown: every round, then the ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.loadgen import Scenario, run_scenario, warm_up
from bench.machine import load_average
from bench.peers import model_directory, running, vllm_mlx_spec
from bench.pipeline import cpu_name
from bench.prompts import PROMPT_SETS
from bench.stats import summarize

CASES = ((1, 8, 32), (16, 1, 64))  # (concurrency, requests per client, new tokens)
PROTOCOLS = ("openai", "ollama")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    model_dir = model_directory()
    print(f"CPU: {cpu_name()}; load average at start: {load_average()}\n")
    print("| round | concurrency | protocol | TTFT p50 s | aggregate tok/s | errors |")
    print("| ---: | ---: | --- | ---: | ---: | ---: |")
    tok_s: dict[tuple[int, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        spec = vllm_mlx_spec(work, model_dir, "vllm-mlx")
        with running(spec, work / "daemon.log"):
            for round_no in range(-1, args.rounds):  # round -1 warms up, uncounted
                order = PROTOCOLS[round_no % 2 :] + PROTOCOLS[: round_no % 2]
                for concurrency, per_client, new_tokens in CASES:
                    for protocol in order:
                        scenario = Scenario(
                            PROMPT_SETS["short"], concurrency, per_client, new_tokens, 900.0,
                            protocol=protocol,
                        )  # fmt: skip
                        asyncio.run(warm_up(spec.base_url, spec.model_id, scenario))
                        results = asyncio.run(run_scenario(spec.base_url, spec.model_id, scenario))
                        s = summarize(results)
                        if round_no < 0:
                            continue
                        tok_s.setdefault((concurrency, protocol), []).append(s.aggregate_tok_s)
                        print(
                            f"| {round_no + 1} | {concurrency} | {protocol} | {s.ttft_s.p50:.3f} "
                            f"| {s.aggregate_tok_s:.1f} | {s.errors} |",
                            flush=True,
                        )
    print(f"\nload average at end: {load_average()}")
    for concurrency, _, _ in CASES:
        openai = sum(tok_s[(concurrency, "openai")]) / args.rounds
        ollama = sum(tok_s[(concurrency, "ollama")]) / args.rounds
        print(
            f"- c={concurrency}, mean of {args.rounds} rounds: /api/chat {ollama:.1f} tok/s, "
            f"/v1/chat/completions {openai:.1f} tok/s: ollama / openai = {ollama / openai:.3f}x"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
