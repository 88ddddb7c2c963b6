"""Vision: the TTFT of an image request, and what one image request costs a running batch.

    python bench/vision.py            # ~3 minutes on 2 cores

One daemon serves the tiny random SmolVLM the tests use (tests/support/tiny_vlm.py: a
2-layer tower, 64-px longest edge, so a picture is 4 tiles plus the global view, 20
image tokens). No real VLM's weights can be downloaded here; the numbers measure the
daemon's own path (decode off the event loop, the tower's encode inside prefill, the
shared batch), not a real tower's compute, which grows with the model.

Cases, each ROUNDS times in a rotating order, every prompt and picture distinct (no
prefix-cache hits):
- `ttft`: one request alone, the same question with and without a picture.
- `c8`: 8 streamed text requests, then the same with one image request sent once
  every text stream has its first token. Reported: the text requests' aggregate tok/s
  and their inter-token gaps (p50, p99, max) while the image is decoded, encoded and
  prefilled beside them.
Prints a markdown table and the machine.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.loadgen import apply_event
from bench.machine import describe, load_average
from bench.peers import running, vllm_mlx_spec
from bench.stats import RequestResult, percentile

ROUNDS = 3
STREAMS = 8
MAX_TOKENS = 128
QUESTION = "Describe what you see in as much detail as you can."


def picture_url(seed: int) -> str:
    """A distinct 64x48 random-noise PNG as a data URL."""
    import numpy as np
    from PIL import Image

    pixels = np.random.RandomState(seed).randint(0, 256, (48, 64, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def body(text: str, image: str | None, max_tokens: int) -> dict[str, Any]:
    content: Any = text
    if image is not None:
        picture = {"type": "image_url", "image_url": {"url": image}}
        content = [picture, {"type": "text", "text": text}]
    return {
        "model": "bench",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def stream(
    client: httpx.AsyncClient, url: str, payload: dict[str, Any], first: asyncio.Event
) -> RequestResult:
    """One streamed request; `first` is set when its first text chunk arrives."""
    result = RequestResult(started=time.perf_counter())
    async with client.stream("POST", f"{url}/v1/chat/completions", json=payload) as resp:
        if resp.status_code != 200:
            result.error = f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}"
            return result
        async for line in resp.aiter_lines():
            if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                continue
            apply_event(result, json.loads(line[5:]), time.perf_counter())
            if result.first_token is not None:
                first.set()
    result.finished = time.perf_counter()
    return result


async def ttft(client: httpx.AsyncClient, url: str, seed: int, with_image: bool) -> float:
    image = picture_url(seed) if with_image else None
    result = await stream(client, url, body(f"{seed}. {QUESTION}", image, 1), asyncio.Event())
    if result.ttft is None:
        raise RuntimeError(result.error or "no token")
    return result.ttft


async def batch(client: httpx.AsyncClient, url: str, seed: int, with_image: bool) -> dict[str, Any]:
    """STREAMS text requests, plus one image request once they all stream."""
    firsts = [asyncio.Event() for _ in range(STREAMS)]
    texts = [
        asyncio.create_task(
            stream(client, url, body(f"Story {seed}-{i}: {QUESTION}", None, MAX_TOKENS), first)
        )
        for i, first in enumerate(firsts)
    ]
    image_ttft = None
    if with_image:
        for first in firsts:
            await first.wait()
        sent = time.perf_counter()
        image = await stream(
            client, url, body(f"{seed}. {QUESTION}", picture_url(seed), 16), asyncio.Event()
        )
        image_ttft = None if image.first_token is None else image.first_token - sent
    results = await asyncio.gather(*texts)
    errors = [r.error for r in results if not r.ok]
    if errors:
        raise RuntimeError(errors[0])
    tokens = sum(r.completion_tokens for r in results)
    wall = max(r.finished or 0.0 for r in results) - min(r.started for r in results)
    gaps = [g for r in results for g in r.inter_token_latencies()]
    return {
        "tok_s": tokens / wall,
        "p50": percentile(gaps, 50),
        "p99": percentile(gaps, 99),
        "max": max(gaps),
        "image_ttft": image_ttft,
    }


async def measure(url: str) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {"ttft_text": [], "ttft_image": [], "c8": [], "c8_image": []}
    timeout = httpx.Timeout(300.0, connect=10.0)
    async with httpx.AsyncClient(timeout=timeout, limits=httpx.Limits(max_connections=16)) as c:
        await ttft(c, url, 10_000, True)  # warm-up: first-call compilation stays out
        await batch(c, url, 10_000, False)
        seed = 0
        for r in range(ROUNDS):
            cases = [("ttft_text", False), ("ttft_image", True)]
            for name, with_image in cases[r % 2 :] + cases[: r % 2]:
                for _ in range(3):
                    seed += 1
                    out[name].append(await ttft(c, url, seed, with_image))
            pair = [("c8", False), ("c8_image", True)]
            for name, with_image in pair[r % 2 :] + pair[: r % 2]:
                seed += 1
                out[name].append(await batch(c, url, seed, with_image))
    return out


def report(out: dict[str, list[Any]]) -> str:
    ms = 1000.0
    text, image = statistics.median(out["ttft_text"]), statistics.median(out["ttft_image"])
    lines = [
        "| case | median | raw |",
        "| --- | ---: | --- |",
        f"| TTFT, text only | {text * ms:.1f} ms | "
        + ", ".join(f"{x * ms:.1f}" for x in out["ttft_text"])
        + " |",
        f"| TTFT, one 64x48 picture (20 image tokens) | {image * ms:.1f} ms | "
        + ", ".join(f"{x * ms:.1f}" for x in out["ttft_image"])
        + " |",
        "",
        f"| {STREAMS} text streams x {MAX_TOKENS} tokens | aggregate tok/s | ITL p50 | ITL p99 "
        "| ITL max | image TTFT in the batch |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, label in (("c8", "alone"), ("c8_image", "+ 1 image request")):
        rows = out[name]
        for i, row in enumerate(rows):
            image_ttft = "" if row["image_ttft"] is None else f"{row['image_ttft'] * ms:.1f} ms"
            lines.append(
                f"| {label}, round {i + 1} | {row['tok_s']:.1f} | {row['p50'] * ms:.1f} ms "
                f"| {row['p99'] * ms:.1f} ms | {row['max'] * ms:.1f} ms | {image_ttft} |"
            )
    alone = statistics.median(r["tok_s"] for r in out["c8"])
    mixed = statistics.median(r["tok_s"] for r in out["c8_image"])
    lines.append("")
    lines.append(f"aggregate with / without the image request: {mixed / alone:.3f}x (medians)")
    return "\n".join(lines)


def main() -> int:
    from tests.support.tiny_model import bundled_tokenizer_dir
    from tests.support.tiny_vlm import make_tiny_vlm

    with tempfile.TemporaryDirectory(prefix="bench-vision-") as tmp:
        work = Path(tmp)
        tokenizer = bundled_tokenizer_dir(work / "cache")
        model = make_tiny_vlm(work / "tiny-vlm", tokenizer)
        spec = vllm_mlx_spec(work, model, "vllm-mlx, tiny SmolVLM")
        print("machine:", json.dumps(describe("auto")), "load before:", load_average())
        with running(spec, work / "daemon.log") as server:
            out = asyncio.run(measure(server.base_url))
        print("load after:", load_average())
    print(report(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
