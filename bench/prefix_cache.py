"""Prefix cache on vs off, side by side: the `prefix2k` and `short` prompt sets.

    python bench/prefix_cache.py          # ~3 minutes on 2 cores

Both daemons run the same weights and BLAS; scenarios alternate between them so that
load drift does not favour one. Results are printed as a markdown table.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.loadgen import Scenario, run_scenario, warm_up
from bench.peers import model_directory, running, vllm_mlx_spec
from bench.prompts import PROMPT_SETS
from bench.stats import summarize

CASES = (("prefix2k", 1), ("prefix2k", 4), ("short", 8))
NEW_TOKENS = 16


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="vllm-mlx-prefix-"))
    model_dir = model_directory()
    specs = [
        vllm_mlx_spec(work, model_dir, "prefix cache on (512 MB)", {"prefix_cache_mb": 512}),
        vllm_mlx_spec(work, model_dir, "prefix cache off", {"prefix_cache_mb": 0}),
    ]
    print("| prompts | concurrency | server | TTFT p50 s | aggregate tok/s | errors |")
    print("| --- | ---: | --- | ---: | ---: | ---: |")
    with running(specs[0], work / "on.log") as on, running(specs[1], work / "off.log") as off:
        for index, (prompt_set, concurrency) in enumerate(CASES):
            scenario = Scenario(PROMPT_SETS[prompt_set], concurrency, 2, NEW_TOKENS, 600.0)
            order = (on, off) if index % 2 == 0 else (off, on)
            for spec in order:
                asyncio.run(warm_up(spec.base_url, spec.model_id, scenario))
                summary = summarize(
                    asyncio.run(run_scenario(spec.base_url, spec.model_id, scenario))
                )
                print(
                    f"| {prompt_set} | {concurrency} | {spec.label} | {summary.ttft_s.p50:.2f} "
                    f"| {summary.aggregate_tok_s:.1f} | {summary.errors} |",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
