"""Load generator: N concurrent streaming chat clients against an OpenAI-compatible URL
(or Ollama's /api/chat, with `protocol="ollama"`).

Closed loop: each client sends its requests back to back, so concurrency stays at N.
Bounded: a fixed number of requests and a deadline for the whole scenario. Loopback
only: the harness measures servers it started on this machine.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

from bench.prompts import PromptSet
from bench.stats import RequestResult

LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1"}


@dataclass(frozen=True)
class Scenario:
    prompt_set: PromptSet
    concurrency: int
    requests_per_client: int
    max_tokens: int
    deadline_s: float
    temperature: float = 0.0
    protocol: str = "openai"  # or "ollama": POST /api/chat, NDJSON


def check_loopback(base_url: str) -> None:
    host = urlsplit(base_url).hostname
    if host not in LOOPBACK_HOSTS:
        raise ValueError(f"{base_url}: the harness only drives servers on loopback")


def request_body(model: str, scenario: Scenario, index: int) -> dict[str, Any]:
    if scenario.protocol == "ollama":
        return {
            "model": model,
            "messages": scenario.prompt_set.messages(index),
            "options": {"num_predict": scenario.max_tokens, "temperature": scenario.temperature},
            "stream": True,
        }
    return {
        "model": model,
        "messages": scenario.prompt_set.messages(index),
        "max_tokens": scenario.max_tokens,
        "temperature": scenario.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def apply_event(result: RequestResult, payload: dict[str, Any], now: float) -> None:
    """Fold one SSE `data:` payload into the request's result."""
    if "error" in payload:
        error = payload["error"]
        result.error = str(error.get("message", error) if isinstance(error, dict) else error)
        return
    usage = payload.get("usage")
    if isinstance(usage, dict) and usage.get("completion_tokens") is not None:
        result.completion_tokens = int(usage["completion_tokens"])
    for choice in payload.get("choices") or ():
        delta = choice.get("delta") or {}
        text = delta.get("content") or delta.get("reasoning_content") or choice.get("text")
        if text:
            if result.first_token is None:
                result.first_token = now
            result.chunk_times.append(now)


def apply_ollama_line(result: RequestResult, payload: dict[str, Any], now: float) -> bool:
    """Fold one /api/chat NDJSON object into the result; True on the last one."""
    if "error" in payload:
        result.error = str(payload["error"])
        return True
    if payload.get("message", {}).get("content"):
        if result.first_token is None:
            result.first_token = now
        result.chunk_times.append(now)
    if payload.get("done"):
        result.completion_tokens = int(payload.get("eval_count") or 0)
        return True
    return False


async def stream_ollama(
    client: httpx.AsyncClient, base_url: str, body: dict[str, Any]
) -> RequestResult:
    result = RequestResult(started=time.perf_counter())
    try:
        async with client.stream("POST", f"{base_url}/api/chat", json=body) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode(errors="replace")[:200]
                result.error = f"HTTP {resp.status_code}: {text}"
                return result
            async for line in resp.aiter_lines():
                if line.strip() and apply_ollama_line(
                    result, json.loads(line), time.perf_counter()
                ):
                    break
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    result.finished = time.perf_counter()
    return result


async def stream_one(
    client: httpx.AsyncClient, base_url: str, body: dict[str, Any]
) -> RequestResult:
    if "options" in body:  # request_body's Ollama shape
        return await stream_ollama(client, base_url, body)
    result = RequestResult(started=time.perf_counter())
    try:
        async with client.stream("POST", f"{base_url}/v1/chat/completions", json=body) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode(errors="replace")[:200]
                result.error = f"HTTP {resp.status_code}: {text}"
                return result
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                apply_event(result, json.loads(data), time.perf_counter())
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    result.finished = time.perf_counter()
    if not result.completion_tokens:
        # No usage chunk: count text chunks (one token each at stream_interval 1).
        result.completion_tokens = len(result.chunk_times)
    return result


async def run_scenario(base_url: str, model: str, scenario: Scenario) -> list[RequestResult]:
    """Every request's result; requests cut off by the deadline count as errors."""
    check_loopback(base_url)
    results: list[RequestResult] = []
    limits = httpx.Limits(max_connections=scenario.concurrency + 4)
    timeout = httpx.Timeout(scenario.deadline_s, connect=10.0)

    async def client_loop(client: httpx.AsyncClient, client_index: int) -> None:
        for k in range(scenario.requests_per_client):
            index = client_index + k * scenario.concurrency
            results.append(await stream_one(client, base_url, request_body(model, scenario, index)))

    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        tasks = [asyncio.create_task(client_loop(client, i)) for i in range(scenario.concurrency)]
        _, pending = await asyncio.wait(tasks, timeout=scenario.deadline_s)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    expected = scenario.concurrency * scenario.requests_per_client
    cut_off = expected - len(results)
    results.extend(
        RequestResult(started=time.perf_counter(), error="deadline") for _ in range(cut_off)
    )
    return results


async def warm_up(base_url: str, model: str, scenario: Scenario) -> None:
    """One short request so first-call costs (compilation, caches) stay out of the numbers."""
    check_loopback(base_url)
    body = request_body(model, scenario, 10_000)
    if "options" in body:
        body["options"]["num_predict"] = 4
    else:
        body["max_tokens"] = 4
    async with httpx.AsyncClient(timeout=scenario.deadline_s) as client:
        await stream_one(client, base_url, body)
