"""The quantized CPU kernel against today's float32 path, side by side in one run.

    python bench/qmm.py            # ~10 minutes on 2 busy cores
    python bench/qmm.py --profile  # also py-spy and perf profiles of the decode step
    python bench/qmm.py --llama-server /path/llama-server --mlx-lm  # and the peers
    python bench/qmm.py --mlx-lm --baseline ../main/.venv/bin/python  # and main's build

Two daemons on the bundled model, same BLAS: `dtype: auto` (the kernel when built) and
`dtype: float32` (today's path); optionally llama-server on the bundled GGUF and
mlx_lm.server on the float32 copy with the same BLAS. Scenarios rotate the order of the
servers so that load drift favours none, and the second round starts them in the reverse
order (a server started later measured faster). Then the resident memory the weights add to a
fresh process, and optionally where a decode step spends its time. Prints markdown.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx

from bench.loadgen import Scenario, run_scenario, warm_up
from bench.machine import load_average
from bench.peers import (
    PeerSpec,
    float32_directory,
    llama_server_spec,
    mlx_lm_spec,
    model_directory,
    running,
    vllm_mlx_spec,
)
from bench.prompts import PROMPT_SETS
from bench.stats import summarize

PATHS = {"kernel": {"dtype": "auto"}, "float32": {"dtype": "float32"}}
INT8_PATH = {"dtype": "auto", "int8_activations": True}
CASES = ((1, 2), (16, 1))  # (concurrency, requests per client)
NEW_TOKENS = 128

# Run in a fresh interpreter: resident memory before and after loading one model.
RSS_CODE = """
import gc, json, sys, psutil
from pathlib import Path
from vllm_mlx.models.cpu import blas
blas.configure()
import mlx.core as mx
from vllm_mlx.config.model import ModelSettings
from vllm_mlx.models.loader import load_model
process = psutil.Process()
# The modules a first load imports (mlx_lm, transformers, our loaders: ~42 MiB) are
# code, not weights: imported before the baseline so the delta is the weights' memory.
import mlx_lm, mlx_lm.utils, mlx_lm.tokenizer_utils, transformers
import vllm_mlx.models.cpu.swiglu, vllm_mlx.models.gguf, vllm_mlx.models.cpu.qmm
mx.eval(mx.zeros(1)); gc.collect()
before = process.memory_info().rss
settings = ModelSettings(name="m", source=sys.argv[1], dtype=sys.argv[2])
loaded = load_model(settings, Path(sys.argv[3]))
gc.collect()
print(json.dumps({"weights_rss": process.memory_info().rss - before}))
"""

# A decode loop to profile: one stream, as the single-stream scenario runs it.
DECODE_CODE = """
import sys
from pathlib import Path
from vllm_mlx.models.cpu import blas
blas.configure()
import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache
from vllm_mlx.config.model import ModelSettings
from vllm_mlx.models.loader import load_model
settings = ModelSettings(name="m", source=sys.argv[1], dtype=sys.argv[2])
model = load_model(settings, Path(sys.argv[3])).model
def decode_loop(steps):
    cache = make_prompt_cache(model)
    token = mx.array([[1]])
    for _ in range(steps):
        token = mx.argmax(model(token, cache=cache)[:, -1], axis=-1, keepdims=True)
        mx.eval(token)
decode_loop(int(sys.argv[4]))
"""


def rss_mib(model_dir: Path, dtype: str, cache: Path) -> float:
    out = subprocess.run(
        [sys.executable, "-c", RSS_CODE, str(model_dir), dtype, str(cache)],
        capture_output=True, text=True, check=True, timeout=600,
    )  # fmt: skip
    return float(json.loads(out.stdout.strip().splitlines()[-1])["weights_rss"]) / 2**20


def daemon_rss_mib(spec: PeerSpec) -> float:
    status = httpx.get(f"{spec.base_url}/v1/status", timeout=30).json()
    return float(status["memory"]["rss_gb"]) * 1024


def kernel_pool(spec: PeerSpec) -> str:
    """The daemon's kernel pool policy and how it was chosen (older builds: not reported)."""
    pool = httpx.get(f"{spec.base_url}/v1/status", timeout=30).json().get("kernel_pool")
    return "not reported" if pool is None else f"{pool['policy']} ({pool['chosen_by']})"


def peer_specs(args: argparse.Namespace, work: Path, model_dir: Path) -> list[PeerSpec]:
    """The kernel and float32 daemons, then the peers asked for (skipped ones reported)."""
    specs = [vllm_mlx_spec(work, model_dir, name, model=cfg) for name, cfg in PATHS.items()]
    if args.int8:  # the kernel with `int8_activations: true` (AVX-512 VNNI)
        specs.append(vllm_mlx_spec(work, model_dir, "kernel-int8", model=INT8_PATH))
    if args.baseline:  # the kernel path of another checkout (its venv's python), e.g. main
        specs.append(
            vllm_mlx_spec(work, model_dir, "baseline", model=PATHS["kernel"], python=args.baseline)
        )
        if args.int8:
            specs.append(
                vllm_mlx_spec(
                    work, model_dir, "baseline-int8", model=INT8_PATH, python=args.baseline
                )
            )
    if args.llama_server:
        from vllm_mlx.models.sources import builtin_path

        gguf = builtin_path("smollm2-135m-instruct")
        # -t 2 spins in barriers between ops: on a loaded 2-core machine -t 1 can be faster.
        specs += [llama_server_spec(args.llama_server, gguf, 16, t) for t in args.threads]
    if args.mlx_lm:
        from vllm_mlx.models.cpu import blas

        choice = blas.configure("auto")  # only to hand mlx_lm.server the same BLAS
        f32_dir = float32_directory(model_dir, work.parent / "bench-models")
        specs.append(mlx_lm_spec(f32_dir, "mlx_lm.server", choice.path))
    for spec in specs:
        if spec.skip:
            print(f"- skipped {spec.label}: {spec.skip}")
    return [spec for spec in specs if not spec.skip]


def serve_side_by_side(specs: list[PeerSpec], work: Path, temperature: float = 0.0) -> None:
    print(f"load average at start: {load_average()}\n")
    print("| concurrency | path | aggregate tok/s | per-stream tok/s p50 | TTFT p50 s | errors |")
    print("| ---: | --- | ---: | ---: | ---: | ---: |")
    results: dict[tuple[int, str], float] = {}
    for round_ in range(2):
        # The order the servers start in showed in their speed (a daemon started after
        # another decoded 4-8% faster on the Xeon VM, docs/benchmarks.md round 21): the
        # second round restarts them in the reverse order.
        order = specs if round_ == 0 else specs[::-1]
        with ExitStack() as stack:
            live = [
                stack.enter_context(running(s, work / f"{s.name}-{s.port}-{round_}.log"))
                for s in order
            ]
            for index, (concurrency, per_client) in enumerate(CASES):
                scenario = Scenario(
                    PROMPT_SETS["short"], concurrency, per_client, NEW_TOKENS, 900.0, temperature
                )
                shift = (round_ * len(CASES) + index) % len(live)
                for spec in live[shift:] + live[:shift]:
                    asyncio.run(warm_up(spec.base_url, spec.model_id, scenario))
                    s = summarize(asyncio.run(run_scenario(spec.base_url, spec.model_id, scenario)))
                    results.setdefault((concurrency, spec.label), 0.0)
                    results[(concurrency, spec.label)] += s.aggregate_tok_s / 2
                    print(
                        f"| {concurrency} | {spec.label} | {s.aggregate_tok_s:.1f} "
                        f"| {s.per_request_tok_s.p50:.1f} | {s.ttft_s.p50:.2f} | {s.errors} |",
                        flush=True,
                    )
            rss = {spec.label: daemon_rss_mib(spec) for spec in specs[:2]}
            pools = {spec.label: kernel_pool(spec) for spec in specs if spec.name == "vllm-mlx"}
    print(f"\nload average at end: {load_average()}")
    for concurrency, _ in CASES:
        for ours in ("kernel", "kernel-int8"):
            if (concurrency, ours) not in results:
                continue
            k = results[(concurrency, ours)]
            ratios = ", ".join(
                f"{ours} / {label} = {k / tok_s:.2f}x"
                for (c, label), tok_s in results.items()
                if c == concurrency and label != ours
            )
            print(f"- concurrency {concurrency} (mean of 2 rounds): {ratios}")
    for label, pool in pools.items():  # measured at load: a busy machine may pick another
        print(f"- {label}: kernel pool {pool}")
    print(f"- daemon RSS after the run: kernel {rss['kernel']:.0f} MiB, "
          f"float32 {rss['float32']:.0f} MiB")  # fmt: skip


def profile(work: Path, model_dir: Path, cache: Path, steps: int) -> None:
    """py-spy (Python side) and perf (native, every thread) of one decode loop per path."""
    for name, cfg in PATHS.items():
        args = [sys.executable, "-c", DECODE_CODE, str(model_dir), cfg["dtype"], str(cache)]
        raw = work / f"pyspy-{name}.txt"
        if not shutil.which("py-spy"):
            print("\n(py-spy is not installed: no Python-side profile)")
        else:
            subprocess.run(
                ["py-spy", "record", "--native", "-r", "200", "-f", "raw", "-o", str(raw), "--",
                 *args, str(steps)], check=True, capture_output=True,
            )  # fmt: skip
            print(f"\n### py-spy, {name} (decode loop, main thread, self time)\n")
            print(top_frames(raw))
        data = work / f"perf-{name}.data"
        subprocess.run(
            ["perf", "record", "-F", "499", "-o", str(data), "--", *args, str(steps)],
            check=True, capture_output=True,
        )  # fmt: skip
        report = subprocess.run(
            ["perf", "report", "-i", str(data), "--stdio", "--sort", "dso,symbol"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        lines = [" ".join(ln.split())[:120] for ln in report.splitlines()]
        lines = [ln for ln in lines if ln and not ln.startswith("#")]
        print(f"\n### perf, {name} (all threads)\n\n```\n" + "\n".join(lines[:14]) + "\n```")


def top_frames(raw: Path, count: int = 8) -> str:
    totals: dict[str, int] = {}
    samples = 0
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if "decode_loop" not in stack:
            continue
        frame = stack.split(";")[-1][:90]
        totals[frame] = totals.get(frame, 0) + int(n)
        samples += int(n)
    best = sorted(totals.items(), key=lambda kv: -kv[1])[:count]
    return "\n".join(f"- {100 * n / samples:.1f}% {frame}" for frame, n in best)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--skip-serve", action="store_true")
    parser.add_argument("--llama-server", help="path to llama.cpp's llama-server binary")
    parser.add_argument("--threads", type=int, nargs="+", default=[2], help="llama-server -t")
    parser.add_argument("--mlx-lm", action="store_true", help="also mlx_lm.server (float32)")
    parser.add_argument("--int8", action="store_true", help="also the kernel with int8_activations")
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default)")
    parser.add_argument("--baseline", help="python of another checkout's venv: its kernel path")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="vllm-mlx-qmm-"))
    model_dir = model_directory()
    if not args.skip_serve:
        serve_side_by_side(peer_specs(args, work, model_dir), work, args.temperature)
    cache = work / "cache"
    kernel, float32 = rss_mib(model_dir, "auto", cache), rss_mib(model_dir, "float32", cache)
    print(f"- weights RSS (fresh process, after load): kernel {kernel:.0f} MiB, float32 "
          f"{float32:.0f} MiB: {kernel / float32:.2f}x")  # fmt: skip
    if args.profile:
        profile(work, model_dir, cache, 200)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
