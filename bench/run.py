"""Benchmark vllm-mlx against its peers on this machine, side by side in one run.

    python bench/run.py --quick      # about 5 minutes: short prompts, concurrency 1 and 16
    python bench/run.py --full       # every prompt set, concurrency 1-32, plots

Writes docs/bench/results-<mode>.{md,json} (and PNG plots) with the machine, load,
versions and date. Every server runs on loopback, started and stopped by this script.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python bench/run.py`: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import yaml

from bench import machine, peers, report
from bench.loadgen import Scenario, run_scenario, warm_up
from bench.prompts import PROMPT_SETS
from bench.stats import summarize

VLLM_MLX = "vllm-mlx"
MLX_LM = "mlx_lm.server"
MLX_LM_SHIPPED = "mlx_lm.server (4-bit, bundled BLAS)"


@dataclass(frozen=True)
class Plan:
    # prompt set -> the concurrency levels it is measured at
    sets: tuple[tuple[str, tuple[int, ...]], ...]
    max_tokens: int
    deadline_s: float
    rounds: int  # every scenario this many times, servers in alternating order
    shipped_peer: bool  # also mlx_lm.server as a user gets it (slow: few scenarios)


PLANS = {
    "quick": Plan((("short", (1, 16)),), 32, 240.0, 2, False),
    "full": Plan(
        (
            ("short", (1, 4, 8, 16, 32)),
            ("unique", (16,)),
            ("long600", (1, 4, 16)),
            ("prefix2k", (1, 16)),
        ),
        64,
        600.0,
        1,
        True,
    ),
}


def requests_per_client(concurrency: int) -> int:
    """At least 4 requests per scenario and 2 per client below 32 clients."""
    return max(2, -(-4 // concurrency)) if concurrency < 32 else 1


def engine_baseline(model_dir: Path, plan: Plan) -> dict[str, Any]:
    sizes = ",".join(str(c) for c in plan.sets[0][1])
    command = [
        sys.executable, "-m", "bench.engine_baseline", "--model-dir", str(model_dir),
        "--max-tokens", str(plan.max_tokens), "--batch-sizes", sizes,
    ]  # fmt: skip
    out = subprocess.run(
        command, capture_output=True, text=True, timeout=1800, cwd=peers.REPO, check=True
    )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def build_specs(args: argparse.Namespace, plan: Plan, work: Path) -> list[peers.PeerSpec]:
    from vllm_mlx.models.cpu import blas
    from vllm_mlx.models.sources import SourceKind, builtin_path, classify_source

    choice = blas.configure("auto")  # this process never imports mlx: only to find the file
    model_dir = peers.model_directory(args.config)
    f32_dir = peers.float32_directory(model_dir, work.parent / "bench-models")
    bl = "OpenBLAS" if choice.optimized else "bundled BLAS"
    specs = [
        peers.vllm_mlx_spec(work, model_dir, f"{VLLM_MLX} (dtype auto, {bl})"),
        *(
            peers.vllm_mlx_spec(work, model_dir, f"{VLLM_MLX} {v} ({bl})", _engine_overrides(v))
            for v in args.variant
        ),
        peers.mlx_lm_spec(f32_dir, f"{MLX_LM} (float32, {bl})", choice.path),
    ]
    if plan.shipped_peer:
        specs.append(peers.mlx_lm_spec(model_dir, MLX_LM_SHIPPED, None))
    source = classify_source(_first_source(args.config))
    if source.kind in (SourceKind.BUILTIN, SourceKind.GGUF_FILE):
        gguf = builtin_path(source.value) if source.kind is SourceKind.BUILTIN else source.path
        specs.append(peers.llama_server_spec(args.llama_server, gguf, 32, args.threads))
    specs.append(peers.pip_vllm_mlx_spec(args.pip_vllm_mlx, f32_dir))
    return specs


def _engine_overrides(variant: str) -> dict[str, Any]:
    """`max_batch_size=32,prefill_batch_size=16` -> engine settings (YAML-typed values)."""
    pairs = (item.split("=", 1) for item in variant.split(",") if item)
    return {key: yaml.safe_load(value) for key, value in pairs}


def _first_source(config: str | None) -> str:
    from vllm_mlx.config.file import load_config

    return load_config(config).settings.models[0].source


def _scenarios(plan: Plan, spec: peers.PeerSpec) -> list[Scenario]:
    out = []
    for name, levels in plan.sets:
        for conc in levels:
            if spec.label == MLX_LM_SHIPPED and (name != "short" or conc > 4):
                continue  # 4-bit + reference BLAS runs at ~5 tok/s: keep it bounded
            shipped = spec.label == MLX_LM_SHIPPED
            per_client = 1 if shipped or name != "short" else requests_per_client(conc)
            scenario = Scenario(
                PROMPT_SETS[name], conc, per_client, plan.max_tokens, plan.deadline_s
            )
            out.append(scenario)
    return out


async def _measure(specs: list[peers.PeerSpec], plan: Plan) -> list[report.Row]:
    rows: list[report.Row] = []
    for spec in specs:
        await warm_up(spec.base_url, spec.model_id, _scenarios(plan, spec)[0])
    keys = [(s.prompt_set.name, s.concurrency) for s in _scenarios(plan, specs[0])]
    turn = 0
    for round_index in range(plan.rounds):
        for key in keys:
            # Alternate the order so load drift on a shared machine favours no server.
            order = specs if turn % 2 == 0 else list(reversed(specs))
            turn += 1
            for spec in order:
                scenario = next(
                    (
                        s
                        for s in _scenarios(plan, spec)
                        if (s.prompt_set.name, s.concurrency) == key
                    ),
                    None,
                )
                if scenario is not None:
                    rows.append(await _one(spec, scenario, round_index))
    return rows


async def _one(spec: peers.PeerSpec, scenario: Scenario, round_index: int) -> report.Row:
    results = await run_scenario(spec.base_url, spec.model_id, scenario)
    row = report.Row(
        spec.label, scenario.prompt_set.name, scenario.concurrency, summarize(results), round_index
    )
    print(
        f"  r{round_index} {row.prompt_set:>8} c={row.concurrency:<3} {spec.label:<50} "
        f"{row.summary.aggregate_tok_s:7.1f} tok/s  TTFT p50 {row.summary.ttft_s.p50:6.2f} s  "
        f"errors={row.summary.errors}",
        flush=True,
    )
    return row


def measure_servers(
    specs: list[peers.PeerSpec], plan: Plan, work: Path
) -> tuple[list[report.Row], list[peers.PeerSpec]]:
    """Rows for every server that started; specs with `skip` set for those that did not."""
    started, final = [], []
    with contextlib.ExitStack() as stack:
        for spec in specs:
            if spec.skip is None:
                print(f"starting {spec.label}", flush=True)
                try:
                    stack.enter_context(peers.running(spec, work / f"{spec.name}-{spec.port}.log"))
                    started.append(spec)
                except RuntimeError as exc:
                    print(f"  {spec.label} failed to start: {exc}", flush=True)
                    spec = dataclasses.replace(spec, skip=f"failed to start: {str(exc)[:200]}")
            final.append(spec)
        return asyncio.run(_measure(started, plan)), final


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="vllm-mlx benchmark against its peers")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_const", const="quick", dest="mode")
    mode.add_argument("--full", action="store_const", const="full", dest="mode")
    parser.add_argument("--config", help="vllm-mlx.yaml whose first model is benchmarked")
    parser.add_argument("--llama-server", help="path to llama.cpp's llama-server binary")
    parser.add_argument("--pip-vllm-mlx", help="a venv with the vllm-mlx PyPI package")
    parser.add_argument("--threads", type=int, default=2, help="llama-server threads")
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        help="also run vllm-mlx with these engine settings, e.g. max_batch_size=32",
    )
    parser.add_argument("--out", default=str(peers.REPO / "docs" / "bench"))
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    plan = PLANS[args.mode or "quick"]
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="vllm-mlx-bench-") as tmp:
        work = Path(tmp) / "run"
        work.mkdir()
        specs = build_specs(args, plan, work)
        info = machine.describe(specs[0].label.split(", ")[-1].rstrip(")"))
        print(f"engine-only baseline ({info['load_average_start']} load)", flush=True)
        mlx_lm = next(s for s in specs if s.label.startswith(MLX_LM))
        baseline = engine_baseline(Path(mlx_lm.model_id), plan)
        rows, specs = measure_servers(specs, plan, work)
    info["load_average_end"] = machine.load_average()
    from bench.results import write_results

    paths = write_results(out_dir, args.mode or "quick", info, specs, baseline, rows, plan, argv)
    print("\n".join(f"wrote {p}" for p in paths))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
