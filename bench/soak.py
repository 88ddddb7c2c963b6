"""Soak: streaming clients for minutes, some disconnecting mid-stream; memory over time.

    .venv/bin/python -m bench.soak --minutes 10 --clients 32 --disconnect 0.3

Starts the daemon on its default config (the bundled model, the default prefix cache),
drives it over loopback, samples the daemon's RSS and /v1/status memory every few
seconds, then waits for the daemon to go idle and checks the end state: nothing
running, no errors, RSS within (idle RSS + the prefix cache bound) * 1.25.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import yaml

from bench import peers
from bench.loadgen import check_loopback
from vllm_mlx.config.sections import EngineSettings

SYSTEM = (
    "You are a support assistant for a hardware store. Answer politely, in short "
    "paragraphs, and suggest one related product when it helps. "
) * 6
TOPICS = ["paint", "drills", "garden hoses", "ladders", "light bulbs", "screws", "tiles"]


@dataclass
class Counts:
    completed: int = 0
    disconnected: int = 0
    errors: list[str] = field(default_factory=list)


@dataclass
class Sample:
    at_s: float
    rss_mb: float
    active_mb: float
    mlx_cache_mb: float
    prefix_cache_mb: float
    running: int


def _body(index: int, max_tokens: int) -> dict[str, Any]:
    topic = TOPICS[index % len(TOPICS)]
    question = f"Customer {index} asks: what should I know before buying {topic}? ({index * 7919})"
    return {
        "model": "default",
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
        "max_tokens": max_tokens,
        "temperature": 0.8,
        "stream": True,
    }


async def _one(client: httpx.AsyncClient, url: str, body: dict[str, Any], cut_after: int | None,
               counts: Counts) -> None:  # fmt: skip
    chunks = 0
    try:
        async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as reply:
            if reply.status_code != 200:
                counts.errors.append(f"HTTP {reply.status_code}: {(await reply.aread())[:200]!r}")
                return
            async for line in reply.aiter_lines():
                if line.startswith("data:") and '"error"' in line:
                    counts.errors.append(line[:200])
                    return
                chunks += line.startswith("data:")
                if cut_after is not None and chunks >= cut_after:
                    counts.disconnected += 1
                    return  # leaving the block closes the connection mid-stream
        counts.completed += 1
    except httpx.HTTPError as exc:
        counts.errors.append(f"{type(exc).__name__}: {exc}")


async def _client(url: str, index: int, args: argparse.Namespace, stop_at: float,
                  counts: Counts) -> None:  # fmt: skip
    rng = random.Random(index)
    async with httpx.AsyncClient(timeout=httpx.Timeout(300.0, connect=10.0)) as client:
        k = 0
        while time.monotonic() < stop_at:
            cut = rng.randint(1, args.max_tokens // 2) if rng.random() < args.disconnect else None
            await _one(client, url, _body(index * 100_000 + k, args.max_tokens), cut, counts)
            k += 1


def _sample(url: str, pid: int, started: float) -> Sample:
    status = httpx.get(f"{url}/v1/status", timeout=30).json()
    memory = status["memory"]
    return Sample(
        at_s=round(time.monotonic() - started, 1),
        rss_mb=round(psutil.Process(pid).memory_info().rss / 2**20, 1),
        active_mb=round(memory["active_gb"] * 1024, 1),
        mlx_cache_mb=round(memory["cache_gb"] * 1024, 1),
        prefix_cache_mb=float(status["cache"]["memory_mb"]),
        running=int(status["num_running"]) + int(status["num_waiting"]),
    )


async def _sampler(url: str, pid: int, started: float, every_s: float, stop: asyncio.Event,
                   samples: list[Sample]) -> None:  # fmt: skip
    while not stop.is_set():
        samples.append(await asyncio.to_thread(_sample, url, pid, started))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(every_s):
                await stop.wait()


async def _drive(url: str, pid: int, args: argparse.Namespace) -> dict[str, Any]:
    counts, samples = Counts(), []
    started = time.monotonic()
    stop_at = started + args.minutes * 60
    stop = asyncio.Event()
    sampler = asyncio.create_task(_sampler(url, pid, started, args.sample_every, stop, samples))
    clients = [_client(url, i, args, stop_at, counts) for i in range(args.clients)]
    await asyncio.gather(*clients)
    stop.set()
    await sampler
    return {"counts": counts, "samples": samples, "seconds": time.monotonic() - started}


def _wait_idle(url: str, timeout_s: float = 120.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = httpx.get(f"{url}/v1/status", timeout=30).json()
        if status["num_running"] == 0 and status["num_waiting"] == 0:
            return True
        time.sleep(0.5)  # polling a condition with a deadline
    return False


def _daemon_pid(port: int) -> int:
    for conn in psutil.net_connections("tcp"):
        if conn.laddr and conn.laddr.port == port and conn.status == "LISTEN" and conn.pid:
            return int(conn.pid)
    raise RuntimeError(f"no process listens on port {port}")


def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="vllm-mlx-soak-"))
    port = peers.free_port()
    config = {"server": {"port": port}, "logging": {"level": "warning", "format": "json"}}
    path = work / "vllm-mlx.yaml"
    path.write_text(yaml.safe_dump(config))
    command = (sys.executable, "-m", "vllm_mlx.cli", "serve", "--config", str(path))
    spec = peers.PeerSpec("vllm-mlx", "soak", command, model_id="default", port=port)
    with peers.running(spec, work / "daemon.log"):
        url = spec.base_url
        check_loopback(url)
        pid = _daemon_pid(port)
        idle = _sample(url, pid, time.monotonic())
        driven = asyncio.run(_drive(url, pid, args))
        idle_again = _wait_idle(url)
        end = _sample(url, pid, time.monotonic())
    cache_mb = EngineSettings().prefix_cache_bytes(psutil.virtual_memory().total) / 2**20
    bound_mb = (idle.rss_mb + cache_mb) * 1.25
    counts: Counts = driven["counts"]
    peak_mb = max(s.rss_mb for s in driven["samples"])
    return {
        "args": vars(args),
        "seconds": round(driven["seconds"], 1),
        "completed": counts.completed,
        "disconnected": counts.disconnected,
        "errors": counts.errors[:20],
        "error_count": len(counts.errors),
        "idle_at_end": idle_again and end.running == 0,
        "start": asdict(idle),
        "end": asdict(end),
        "peak_rss_mb": peak_mb,
        "rss_bound_mb": round(bound_mb, 1),
        # The bound is on what stays once idle; under load the live requests' own KV
        # caches come on top (reported as the peak).
        "within_bound": end.rss_mb <= bound_mb,
        "samples": [asdict(s) for s in driven["samples"]],
    }  # fmt: skip


def markdown(result: dict[str, Any]) -> str:
    a, s, e = result["args"], result["start"], result["end"]
    return "\n".join([
        f"Soak: {a['clients']} streaming clients, {a['minutes']} min, "
        f"{int(a['disconnect'] * 100)}% disconnecting mid-stream, max_tokens {a['max_tokens']}, "
        "default config.",
        "",
        "| | RSS MB | MLX active MB | MLX buffer cache MB | prefix cache MB | running |",
        "|---|---|---|---|---|---|",
        f"| idle before | {s['rss_mb']} | {s['active_mb']} | {s['mlx_cache_mb']} "
        f"| {s['prefix_cache_mb']} | {s['running']} |",
        f"| peak during (live KV caches included) | {result['peak_rss_mb']} | | | | |",
        f"| idle after | {e['rss_mb']} | {e['active_mb']} | {e['mlx_cache_mb']} "
        f"| {e['prefix_cache_mb']} | {e['running']} |",
        "",
        f"Requests: {result['completed']} completed, {result['disconnected']} disconnected, "
        f"{result['error_count']} errors; idle at the end: {result['idle_at_end']}; "
        f"RSS bound once idle (idle + cache bound) x 1.25 = {result['rss_bound_mb']} MB: "
        f"{'held' if result['within_bound'] else 'EXCEEDED'}.",
    ])  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--disconnect", type=float, default=0.3)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--sample-every", type=float, default=5.0)
    parser.add_argument("--out", type=Path, default=Path("bench/results/soak.json"))
    args = parser.parse_args(argv)
    result = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, default=str))
    print(markdown(result))
    ok = result["error_count"] == 0 and result["idle_at_end"] and result["within_bound"]
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
