"""One YAML, three kinds of source, each loaded on its first request: the bundled model,
a GGUF file given by path, and a converted MLX directory made here (docs/models.md)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import DaemonProcess, running
from vllm_mlx.models.gguf import import_gguf
from vllm_mlx.models.sources import builtin_path

NAMES = ("bundled", "gguf-file", "converted-dir")


@pytest.fixture(scope="module")
def daemon(
    tmp_path_factory: pytest.TempPathFactory, model_cache_dir: Path
) -> Iterator[DaemonProcess]:
    gguf = builtin_path("smollm2-135m-instruct")
    # A converted directory of our own: the GGUF imported to MLX format, then moved
    # where no cache knows it, so the daemon reads it as a plain local model folder.
    imported = import_gguf(gguf, tmp_path_factory.mktemp("import"))
    converted = tmp_path_factory.mktemp("converted") / "smollm2-mlx"
    shutil.copytree(imported, converted)
    config = {
        "models": [
            {"name": "bundled", "source": "builtin:smollm2-135m-instruct", "load": "on_demand"},
            {"name": "gguf-file", "source": str(gguf)},
            {"name": "converted-dir", "source": str(converted), "dtype": "float32"},
        ],
    }
    with running(tmp_path_factory.mktemp("sources"), model_cache_dir, config) as process:
        yield process


def states(daemon: DaemonProcess) -> dict[str, str]:
    document = httpx.get(f"{daemon.base_url}/v1/status", timeout=10).json()
    return {block["model"]: block["state"] for block in document["models"]}


def test_every_source_loads_on_its_first_request(daemon: DaemonProcess) -> None:
    assert set(states(daemon).values()) == {"not_loaded"}
    texts = []
    for name in NAMES:
        response = httpx.post(
            f"{daemon.base_url}/v1/completions",
            json={"model": name, "prompt": "The capital of France is", "max_tokens": 4,
                  "temperature": 0},
            timeout=300,
        )  # fmt: skip
        assert response.status_code == 200, response.text
        texts.append(response.json()["choices"][0]["text"])
        assert states(daemon)[name] == "running"
    # The same weights from three sources: the same greedy text (float32 included, on
    # these 4 tokens; docs/benchmarks.md compares the paths over 20 prompts).
    assert texts[0] == texts[1] == texts[2], texts
