"""What the edge costs per request, in-process: the key check, limits, quotas and usage
accounting of api/edge/middleware.py around an app that does nothing.

    python bench/edge_overhead.py --requests 20000 --rounds 5

The same ASGI middleware with two settings, alternating: "off" (no keys, usage off)
and "on" (20 named keys, each with scopes, models, token rate limits and a daily quota;
usage written to SQLite in a temporary directory). The inner app answers 200 and
charges the request 40 prompt and 8 completion tokens, as a short chat would. Prints
microseconds per request for each, and what the difference is as a share of a
request's time at c=16 (`--request-ms`, measured by bench/keys_overhead.py).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.keys_overhead import KEYS, keyed_sections
from bench.pipeline import cpu_name
from vllm_mlx.api.edge.middleware import OpsMiddleware
from vllm_mlx.api.state import ServerState
from vllm_mlx.config.model import ModelSettings
from vllm_mlx.config.settings import Settings
from vllm_mlx.engine.fleet.registry import ModelRegistry
from vllm_mlx.engine.scheduler_state import SchedulerConfig
from vllm_mlx.usage.ledger import UsageLedger
from vllm_mlx.usage.record import add_usage, note_usage_model
from vllm_mlx.usage.store import DATABASE_NAME

BODY = b'{"model": "bench", "messages": [{"role": "user", "content": "hi"}]}'


async def inner_app(scope: Any, receive: Any, send: Any) -> None:
    await receive()
    note_usage_model("bench")
    add_usage(40, 16, 8, 0.05)
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"{}", "more_body": False})


def _state(settings: Settings, state_dir: Path) -> ServerState:
    state = ServerState(settings, ModelRegistry(settings.models, SchedulerConfig()))
    if settings.usage.enabled:
        state.usage = UsageLedger(state_dir / DATABASE_NAME, lambda: 400)
    return state


def _client() -> Any:
    """receive() of a client that sends BODY and then stays (never a disconnect)."""
    delivered = False

    async def receive() -> Any:
        nonlocal delivered
        if delivered:
            await asyncio.Event().wait()
        delivered = True
        return {"type": "http.request", "body": BODY, "more_body": False}

    return receive


async def _requests(middleware: OpsMiddleware, count: int, keyed: bool) -> float:
    """Seconds for `count` requests, one after another."""

    async def send(message: Any) -> None:
        return None

    began = time.perf_counter()
    for n in range(count):
        headers = [(b"content-type", b"application/json"), (b"host", b"127.0.0.1")]
        if keyed:
            headers.append((b"authorization", f"Bearer {KEYS[n % len(KEYS)]}".encode()))
        receive = _client()

        scope = {
            "type": "http",
            "method": "POST",
            "path": "/v1/chat/completions",
            "root_path": "",
            "headers": headers,
            "client": ("127.0.0.1", 50000),
        }
        await middleware(scope, receive, send)
    return time.perf_counter() - began


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--request-ms", type=float, default=0.0,
                        help="a request's time at c=16, for the share")  # fmt: skip
    args = parser.parse_args()
    model = ModelSettings(name="bench", source="builtin:smollm2-135m-instruct")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        off = Settings(models=[model], usage={"enabled": False})
        on = Settings(models=[model], **keyed_sections())
        states = {"off": _state(off, work / "off"), "on": _state(on, work / "on")}
        edges = {label: OpsMiddleware(inner_app, state) for label, state in states.items()}
        print(f"CPU: {cpu_name()}\n")
        print("| round | edge | µs per request |")
        print("| ---: | --- | ---: |")
        per: dict[str, list[float]] = {"off": [], "on": []}
        for round_no in range(-1, args.rounds):  # -1 warms up, uncounted
            order = ["off", "on"] if round_no % 2 == 0 else ["on", "off"]
            for label in order:
                seconds = asyncio.run(_requests(edges[label], args.requests, label == "on"))
                if round_no < 0:
                    continue
                micro = seconds / args.requests * 1e6
                per[label].append(micro)
                print(f"| {round_no + 1} | {label} | {micro:.1f} |", flush=True)
        for state in states.values():
            if state.usage is not None:
                state.usage.close()
    on_us = sorted(per["on"])[len(per["on"]) // 2]
    off_us = sorted(per["off"])[len(per["off"]) // 2]
    print(f"\n- median of {args.rounds} rounds: on {on_us:.1f} µs, off {off_us:.1f} µs, "
          f"difference {on_us - off_us:.1f} µs per request")  # fmt: skip
    if args.request_ms > 0:
        share = (on_us - off_us) / (args.request_ms * 1000) * 100
        print(f"- as a share of a {args.request_ms:.0f} ms request: {share:.3f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
