"""Prefix caches side by side: paged (16-token blocks), whole-prompt, and off.

    python bench/prefix_cache.py          # ~15 minutes on 2 busy cores
    python bench/prefix_cache.py --no-off # paged vs whole-prompt only (~5 minutes)

Three daemons run the same weights and BLAS with the default 512 MB bound; each case
runs on all three, in a rotating order so that load drift does not favour one. Cases:
`prefix2k` (one 2k-token system prompt, distinct user turns) and `long600` (distinct
600-token documents: little to share). After each case the cache's bytes and entries
are read from /v1/status (cumulative: every daemon has seen the same requests).
Results are printed as a markdown table, with the machine's load before and after.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.loadgen import Scenario, run_scenario, warm_up
from bench.peers import PeerSpec, model_directory, running, vllm_mlx_spec
from bench.prompts import PROMPT_SETS
from bench.stats import summarize

# (prompt set, concurrency, requests per client)
CASES = (("prefix2k", 1, 4), ("prefix2k", 4, 2), ("long600", 4, 2))
NEW_TOKENS = 16
KINDS = (
    ("paged", {"use_paged_cache": True}),
    ("whole-prompt", {"use_paged_cache": False}),
    ("off", {"cache_memory_mb": 0}),
)


def _cache(spec: PeerSpec) -> dict[str, Any]:
    document = httpx.get(f"{spec.base_url}/v1/status", timeout=30).json()
    block: dict[str, Any] = document["models"][0]["cache"]
    return block


def _row(spec: PeerSpec, case: tuple[str, int, int]) -> str:
    prompt_set, concurrency, per_client = case
    scenario = Scenario(PROMPT_SETS[prompt_set], concurrency, per_client, NEW_TOKENS, 900.0)
    asyncio.run(warm_up(spec.base_url, spec.model_id, scenario))
    summary = summarize(asyncio.run(run_scenario(spec.base_url, spec.model_id, scenario)))
    cache = _cache(spec)
    return (
        f"| {prompt_set} | {concurrency} | {spec.label} | {summary.ttft_s.p50:.2f} "
        f"| {summary.ttft_s.p90:.2f} | {summary.aggregate_tok_s:.1f} | {cache['memory_mb']:.1f} "
        f"| {cache['entries']} | {cache['hit_rate']:.2f} | {summary.errors} |"
    )


def main() -> int:
    kinds = KINDS[:2] if "--no-off" in sys.argv[1:] else KINDS
    work = Path(tempfile.mkdtemp(prefix="vllm-mlx-prefix-"))
    model_dir = model_directory()
    specs = [vllm_mlx_spec(work, model_dir, label, engine) for label, engine in kinds]
    print(f"load before: {os.getloadavg()}")
    print("| prompts | concurrency | cache | TTFT p50 s | TTFT p90 s | aggregate tok/s "
          "| cache MB after | entries | hit rate | errors |")  # fmt: skip
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    with contextlib.ExitStack() as stack:
        servers = [stack.enter_context(running(s, work / f"{s.port}.log")) for s in specs]
        for index, case in enumerate(CASES):
            shift = index % len(servers)
            for spec in servers[shift:] + servers[:shift]:
                print(_row(spec, case), flush=True)
    print(f"load after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
