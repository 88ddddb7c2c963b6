"""Start-up: from starting the server to its first answer, against the peers.

    python bench/startup.py --rounds 5
    python bench/startup.py --rounds 5 --llama-server /path/llama-server --mlx-lm

A restart is what an operator waits through after a model change (or a crash), and the
test suite starts ~80 daemons, so start-up is most of its time beside generation. Each
round starts every server once, in rotating order, on the bundled model (vllm-mlx on
its GGUF import, mlx_lm.server on a float32 copy, llama-server on the GGUF itself), and
times from the process's start to the first successful one-token chat completion,
polled every 20 ms. For vllm-mlx the JSON log also gives the time to `listening` (HTTP
up) and to `model ready` (loaded and warmed), and a separate interpreter times the
imports of the serve path alone.

Prints markdown with the raw numbers (seconds, every round), the CPU and the load.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx

from bench.machine import describe, load_average
from bench.peers import (
    REPO,
    STARTUP_TIMEOUT_S,
    PeerSpec,
    float32_directory,
    llama_server_spec,
    mlx_lm_spec,
    model_directory,
    stop,
    vllm_mlx_spec,
)

POLL_S = 0.02
IMPORTS = "import vllm_mlx.cli.main, vllm_mlx.runtime.daemon"


def answers(spec: PeerSpec) -> bool:
    body = {"model": spec.model_id, "messages": [{"role": "user", "content": "Hi"}]}
    try:
        reply = httpx.post(
            f"{spec.base_url}/v1/chat/completions", json={**body, "max_tokens": 1}, timeout=30
        )
    except httpx.HTTPError:
        return False
    return reply.status_code == 200


def log_seconds(log: Path, started_wall: float) -> dict[str, float]:
    """Seconds from the start to vllm-mlx's `listening` and first `model ready` lines."""
    out: dict[str, float] = {}
    for line in log.read_text(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        event = entry.get("event")
        if event in ("listening", "model ready") and event not in out and "timestamp" in entry:
            at = datetime.datetime.fromisoformat(entry["timestamp"].replace("Z", "+00:00"))
            out[str(event)] = round(at.timestamp() - started_wall, 3)
    return out


def time_start(spec: PeerSpec, log: Path) -> dict[str, float]:
    """Start the server, poll until it answers, stop it; the seconds it took."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **spec.env}
    started_wall, started = time.time(), time.perf_counter()
    with log.open("wb") as sink:
        process = subprocess.Popen(
            spec.command, stdout=sink, stderr=subprocess.STDOUT, env=env, cwd=REPO
        )
    try:
        while not answers(spec):
            if process.poll() is not None or time.perf_counter() - started > STARTUP_TIMEOUT_S:
                raise RuntimeError(f"{spec.name} did not start:\n{log.read_text()[-2000:]}")
            time.sleep(POLL_S)  # polling a readiness condition
        result = {"first answer": round(time.perf_counter() - started, 3)}
    finally:
        stop(process)
    return {**log_seconds(log, started_wall), **result}


def import_seconds() -> float:
    code = f"import time; t = time.perf_counter(); {IMPORTS}; print(time.perf_counter() - t)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return round(float(done.stdout.strip().splitlines()[-1]), 3)


def listed(values: list[float]) -> str:
    return ", ".join(f"{v:.2f}" for v in values)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--llama-server", help="path to llama.cpp's llama-server binary")
    parser.add_argument("--mlx-lm", action="store_true", help="also mlx_lm.server (float32)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="vllm-mlx-startup-"))
    model_dir = model_directory()
    print(f"machine: {json.dumps(describe('auto'))}\n\nload average at start: {load_average()}\n")
    # The daemon logs at info: its `listening` and `model ready` lines are timed.
    specs = [
        vllm_mlx_spec(
            work, model_dir, "vllm-mlx", paths={"cache_dir": str(work / "cache")},
            sections={"logging": {"level": "info", "format": "json"}},
        )
    ]  # fmt: skip
    if args.llama_server:
        from vllm_mlx.models.sources import builtin_path

        specs.append(
            llama_server_spec(args.llama_server, builtin_path("smollm2-135m-instruct"), 1, 2)
        )
    if args.mlx_lm:
        f32_dir = float32_directory(model_dir, work.parent / "bench-models")
        specs.append(mlx_lm_spec(f32_dir, "mlx_lm.server (float32)", None))
    for spec in [s for s in specs if s.skip]:
        print(f"- skipped {spec.label}: {spec.skip}")
    specs = [s for s in specs if not s.skip]
    time_start(specs[0], work / "first.log")  # the GGUF import, once, outside the rounds
    results: dict[str, list[dict[str, float]]] = {s.label: [] for s in specs}
    imports: list[float] = []
    for round_index in range(args.rounds):
        for spec in specs[round_index % len(specs) :] + specs[: round_index % len(specs)]:
            log = work / f"{spec.name}-{round_index}.log"
            results[spec.label].append(time_start(spec, log))
        imports.append(import_seconds())
    print("| server | to first answer, s (each round) | median |")
    print("| --- | --- | ---: |")
    for label, rounds in results.items():
        firsts = [r["first answer"] for r in rounds]
        print(f"| {label} | {listed(firsts)} | {statistics.median(firsts):.2f} |")
    ours = results[specs[0].label]
    print("\nvllm-mlx, medians (s):")
    for key in ("listening", "model ready", "first answer"):
        values = [r[key] for r in ours if key in r]
        if values:
            print(f"- {key}: {statistics.median(values):.2f} ({listed(values)})")
    median = statistics.median(imports)
    print(f"- imports of the serve path alone: {median:.2f} ({listed(imports)})")
    print(f"\nload average at end: {load_average()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
