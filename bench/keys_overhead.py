"""What 20 named keys and usage accounting cost the request path, side by side in one run.

    python bench/keys_overhead.py --rounds 6

Two daemons of this checkout on the bundled model: "off" (no keys, `usage.enabled:
false`) and "on" (20 named keys with scopes, models, a token rate limit and a daily
quota that never bites; usage written to SQLite). Each round, in an order that rotates
so load drift favours neither, 16 concurrent clients (each its own key on "on") send
short non-streamed chats (8 new tokens: the per-request path is a large share of the
time). Prints markdown: every round, then the mean ratio on / off.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.machine import load_average
from bench.peers import model_directory, running, vllm_mlx_spec
from bench.pipeline import cpu_name
from vllm_mlx.config.auth import key_digest

CONCURRENCY = 16
REQUESTS_PER_CLIENT = 6
NEW_TOKENS = 8
KEYS = [f"sk-bench-{n:02d}-0123456789abcdef" for n in range(20)]


def keyed_sections() -> dict[str, Any]:
    entries = [
        {
            "name": f"app-{n:02d}",
            "key_sha256": key_digest(key).hex(),
            "scopes": ["inference"],
            "models": ["bench"],
            "rate_limit": {"requests_per_minute": 100_000, "tokens_per_minute": 10_000_000},
            "quota": {"tokens_per_day": 1_000_000_000},
        }
        for n, key in enumerate(KEYS)
    ]
    return {"auth": {"keys": entries}, "usage": {"enabled": True}}


async def one_round(base_url: str, keyed: bool) -> tuple[float, float, int]:
    """(requests/s, completion tok/s, errors) of CONCURRENCY clients."""
    completion = 0
    errors = 0

    async def client_loop(client: httpx.AsyncClient, index: int) -> None:
        nonlocal completion, errors
        headers = {"Authorization": f"Bearer {KEYS[index % len(KEYS)]}"} if keyed else {}
        for k in range(REQUESTS_PER_CLIENT):
            body = {
                "model": "bench",
                "messages": [{"role": "user", "content": f"Say a word about {index}-{k}."}],
                "max_tokens": NEW_TOKENS,
                "temperature": 0,
                "logit_bias": {"2": -100},  # no early end-of-sequence: same work per request
            }
            response = await client.post(
                f"{base_url}/v1/chat/completions", json=body, headers=headers
            )
            if response.status_code != 200:
                errors += 1
                continue
            completion += response.json()["usage"]["completion_tokens"]

    limits = httpx.Limits(max_connections=CONCURRENCY + 4)
    async with httpx.AsyncClient(limits=limits, timeout=600) as client:
        began = time.perf_counter()
        await asyncio.gather(*(client_loop(client, i) for i in range(CONCURRENCY)))
        seconds = time.perf_counter() - began
    return CONCURRENCY * REQUESTS_PER_CLIENT / seconds, completion / seconds, errors


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    model_dir = model_directory()
    print(f"CPU: {cpu_name()}; load average at start: {load_average()}\n")
    print("| round | daemon | requests/s | completion tok/s | errors |")
    print("| ---: | --- | ---: | ---: | ---: |")
    rates: dict[str, list[float]] = {"on": [], "off": []}
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        work = Path(tmp)
        off = vllm_mlx_spec(
            work, model_dir, "off", paths={"state_dir": str(work / "off")},
            sections={"usage": {"enabled": False}},
        )  # fmt: skip
        on = replace(
            vllm_mlx_spec(
                work, model_dir, "on", paths={"state_dir": str(work / "on")},
                sections=keyed_sections(),
            ),
            api_key=KEYS[0],
        )  # fmt: skip
        live = [stack.enter_context(running(s, work / f"{s.label}.log")) for s in (off, on)]
        for round_no in range(-1, args.rounds):  # round -1 warms both up, uncounted
            order = live[round_no % 2 :] + live[: round_no % 2]
            for spec in order:
                per_s, tok_s, errors = asyncio.run(one_round(spec.base_url, spec.label == "on"))
                if round_no < 0:
                    continue
                rates[spec.label].append(tok_s)
                print(f"| {round_no + 1} | {spec.label} | {per_s:.2f} | {tok_s:.1f} | {errors} |",
                      flush=True)  # fmt: skip
    print(f"\nload average at end: {load_average()}")
    mean_on = sum(rates["on"]) / len(rates["on"])
    mean_off = sum(rates["off"]) / len(rates["off"])
    print(
        f"- c={CONCURRENCY}, mean of {args.rounds} rounds: on {mean_on:.1f}, off "
        f"{mean_off:.1f} completion tok/s: on/off = {mean_on / mean_off:.3f}x"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
