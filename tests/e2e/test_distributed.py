"""One model across 3 processes: mlx.launch, the ring backend on 127.0.0.1, tensor parallel.

3 ranks, not 2: SmolLM2-135M has 9 attention heads and 3 KV heads, and mlx-lm's
`shard` splits each projection's rows evenly (9 heads over 2 ranks would leave 4.5
heads per rank; the daemon refuses that at load with a clear error).

The group serves the bundled model as float32; the reference is the single-process
daemon with the same dtype. On a 2-core machine 3 ranks share 2 cores, every ring
collective costs tens of milliseconds (MLX's ring polls its sockets from threads) and a
step has 61 of them (30 layers x 2 all_sums, plus the token share), so a step takes
seconds. The comparisons with the single-process daemon on this model (two chats at
once; 10 prompts at concurrency 4, streaming on both APIs) run with
VLLM_MLX_TEST_DISTRIBUTED=1; by default this module checks what only the real model's
group shows: each rank's share of the real weights, status and metrics, a hot reload,
and a stop. test_distributed_tiny.py runs the rest by default on tiny models, where a
step costs a fraction of a second: the full greedy comparison at 2 and 3 ranks,
pipeline parallelism, a model reload, shared sampling, the grammar on rank 0, and a
killed rank.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import DaemonProcess, running
from tests.e2e.ops_support import wait_for
from tests.support.tiny_model import PROMPTS

RANKS = 3
MAX_TOKENS = 4
FULL = os.environ.get("VLLM_MLX_TEST_DISTRIBUTED") == "1"
full_only = pytest.mark.skipif(not FULL, reason="minutes on 2 cores: VLLM_MLX_TEST_DISTRIBUTED=1")
GROUP = {"distributed": {"ranks": RANKS, "heartbeat": 0.5}, "metrics": {"enabled": True}}
FLOAT32 = {
    "models": [
        {
            "name": "smollm2-135m-instruct",
            "source": "builtin:smollm2-135m-instruct",
            "aliases": ["default"],
            "dtype": "float32",
        }
    ]
}


@pytest.fixture(scope="module")
def group(
    tmp_path_factory: pytest.TempPathFactory, model_cache_dir: Path
) -> Iterator[DaemonProcess]:
    with running(tmp_path_factory.mktemp("group"), model_cache_dir, GROUP) as daemon:
        yield daemon


@pytest.fixture(scope="module")
def reference(
    tmp_path_factory: pytest.TempPathFactory, model_cache_dir: Path
) -> Iterator[DaemonProcess]:
    with running(tmp_path_factory.mktemp("single"), model_cache_dir, FLOAT32) as daemon:
        yield daemon


def _chat(daemon: DaemonProcess, prompt: str) -> str:
    client = openai.OpenAI(base_url=f"{daemon.base_url}/v1", api_key="x", timeout=600)
    reply = client.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": prompt}],
        max_tokens=MAX_TOKENS,
        temperature=0,
    )
    return reply.choices[0].message.content or ""


def _log_events(daemon: DaemonProcess, event: str) -> list[dict[str, Any]]:
    found = []
    for line in daemon.log_text().splitlines():
        if line.startswith("{") and f'"{event}"' in line:
            found.append(json.loads(line))
    return found


@full_only  # test_distributed_tiny.py compares greedy outputs at 2 and 3 ranks by default
def test_two_concurrent_greedy_chats_match_the_single_process_daemon(
    group: DaemonProcess, reference: DaemonProcess
) -> None:
    with ThreadPoolExecutor(2) as pool:
        got = list(pool.map(lambda p: _chat(group, p), PROMPTS[:2]))
    assert got == [_chat(reference, p) for p in PROMPTS[:2]]
    assert all(got)


@full_only
def test_greedy_outputs_match_the_single_process_daemon(
    group: DaemonProcess, reference: DaemonProcess
) -> None:
    with ThreadPoolExecutor(4) as pool:  # concurrency 4: the ranks step shared batches
        got = list(pool.map(lambda p: _chat(group, p), PROMPTS))
    expected = [_chat(reference, p) for p in PROMPTS]
    assert got == expected
    assert all(got)


@full_only
def test_streaming_on_both_apis_matches(group: DaemonProcess, reference: DaemonProcess) -> None:
    prompt = PROMPTS[0]
    client = openai.OpenAI(base_url=f"{group.base_url}/v1", api_key="x", timeout=600)
    stream = client.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": prompt}],
        max_tokens=MAX_TOKENS,
        temperature=0,
        stream=True,
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == _chat(reference, prompt)

    def anthropic_stream(daemon: DaemonProcess) -> str:
        client = anthropic.Anthropic(base_url=daemon.base_url, api_key="x", timeout=600)
        with client.messages.stream(
            model="default",
            max_tokens=MAX_TOKENS,
            messages=[{"role": "user", "content": prompt}],
            extra_body={"temperature": 0},
        ) as events:
            return "".join(events.text_stream)

    assert anthropic_stream(group) == anthropic_stream(reference)


def test_status_shows_the_ranks_and_each_holds_its_share(
    group: DaemonProcess, model_cache_dir: Path
) -> None:
    # One step is enough to give every rank a step time (a step takes seconds here).
    reply = httpx.post(
        f"{group.base_url}/v1/completions",
        json={"model": "default", "prompt": "Once upon a time", "max_tokens": 1},
        timeout=600,
    )
    assert reply.status_code == 200, reply.text
    # Each rank's times reach rank 0 when the group next goes idle: wait for them.
    deadline = time.monotonic() + 60
    while True:
        status = httpx.get(f"{group.base_url}/v1/status", timeout=10).json()["distributed"]
        ranks = status["ranks"]
        if all(r["steps"] > 0 for r in ranks) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert status["size"] == RANKS and status["state"] == "serving"
    assert [r["rank"] for r in ranks] == list(range(RANKS))
    assert all(r["host"] for r in ranks)
    assert all(r["steps"] > 0 and r["step_ms"] > 0 for r in ranks)  # gathered from each
    metrics = httpx.get(f"{group.base_url}/metrics", timeout=10).text
    families = {f.name: f for f in text_string_to_metric_families(metrics)}
    assert families["vllm_mlx_distributed_up"].samples[0].value == 1
    by_rank = {
        s.labels["rank"]: s.value for s in families["vllm_mlx_distributed_weight_bytes"].samples
    }
    assert by_rank == {str(r["rank"]): r["weight_bytes"] for r in ranks}
    steps = families["vllm_mlx_distributed_step_seconds"].samples
    assert len(steps) == RANKS and all(s.value > 0 for s in steps)
    full = _float32_model_bytes(model_cache_dir)
    embedding = 49152 * 576 * 4  # tied embeddings: replicated on every rank
    for r in ranks:  # the layers split in 3, the embedding table whole
        assert r["weight_bytes"] == pytest.approx(embedding + (full - embedding) / RANKS, rel=0.01)
        assert r["weight_bytes"] < 0.5 * full


def _float32_model_bytes(cache_dir: Path) -> int:
    """The unsharded float32 model, measured the same way (parameter bytes)."""
    code = (
        "import mlx.core as mx, sys\n"
        "from mlx.utils import tree_flatten\n"
        "from mlx_lm.utils import load\n"
        "from vllm_mlx.models.dtype import apply_dtype\n"
        "m = load(sys.argv[1])[0]\n"
        "m, _ = apply_dtype(m, 'float32', blas_optimized=True)\n"
        "print(sum(v.nbytes for _, v in tree_flatten(m.parameters())))\n"
    )
    (config,) = cache_dir.glob("gguf/*/config.json")  # the GGUF the daemons imported
    out = subprocess.run(
        [sys.executable, "-c", code, str(config.parent)], capture_output=True, text=True, check=True
    )
    return int(out.stdout.strip().splitlines()[-1])


def test_hot_settings_reload_on_rank_0(group: DaemonProcess) -> None:
    """A hot key (API keys) applies at once; the model and the group are untouched."""

    def models(key: str) -> int:
        headers = {"Authorization": f"Bearer {key}"}
        return httpx.get(f"{group.base_url}/v1/models", headers=headers).status_code

    assert models("other") == 200  # no keys yet
    settings = yaml.safe_load(group.config_path.read_text())
    settings["auth"] = {"api_keys": ["group-key"]}
    scratch = group.config_path.with_suffix(".tmp")
    scratch.write_text(yaml.safe_dump(settings, sort_keys=False))
    os.replace(scratch, group.config_path)
    wait_for(lambda: models("other") == 401, 60, "the new key list")
    assert models("group-key") == 200
    assert httpx.get(f"{group.base_url}/health").json()["status"] == "ok"


def test_sigterm_on_rank_0_drains_and_stops_the_group(group: DaemonProcess) -> None:
    assert group.stop(signal.SIGTERM, timeout=120) == 0
    assert len(_log_events(group, "rank 0 stopped the group")) == RANKS - 1
