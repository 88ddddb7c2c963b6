"""Distributed groups of 2 and 3 ranks on tiny random models (tests/support/tiny_model.py).

The bundled model splits over 3 ranks only and a 3-rank step costs seconds here; a
2-layer model of width 96 costs a few collectives per step, so the issue's full check
runs by default: greedy outputs identical to the single-process daemon for 10 prompts
at concurrency 4, non-streaming and streaming on both APIs. Also pipeline parallelism
(a tiny qwen2: mlx-lm's qwen2 has `model.model.pipeline`), a model change in the
YAML of a running group re-sharding on every rank, and on the 3-rank group: every rank
following the token rank 0 sampled, the grammar applied on rank 0 only, and a rank killed
mid-stream failing the stream and the group within the stated bound.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
import yaml

from tests.conftest import DaemonProcess, running
from tests.e2e.ops_support import wait_for
from tests.support.tiny_model import PROMPTS, bundled_tokenizer_dir, make_tiny_model

MAX_TOKENS = 8
# The generation in flight across a reload: long enough that it cannot finish between its
# first token and the SIGHUP (a tiny-model step is milliseconds).
LONG_TOKENS = 160
# The 3-rank group's step_timeout: a tiny step takes ~0.4 s on a loaded 2-core machine.
STEP_TIMEOUT_S = 5.0
# The stated bound (docs/distributed.md): step_timeout + 0.25 s watchdog poll + 1 s
# grace; slack on top for a loaded machine.
KILL_BOUND_S = 20.0
# model name in the reference daemon -> (architecture, seed)
TINY = {"tiny-a": ("llama", 0), "tiny-b": ("llama", 1), "tiny-p": ("qwen2", 2)}


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory: pytest.TempPathFactory, model_cache_dir: Path) -> dict[str, Path]:
    tokenizer = bundled_tokenizer_dir(model_cache_dir)
    root = tmp_path_factory.mktemp("tiny-models")
    return {
        name: make_tiny_model(root / name, tokenizer, kind, seed)
        for name, (kind, seed) in TINY.items()
    }


def _served(name: str, source: Path) -> dict[str, Any]:
    return {"models": [{"name": "tiny", "source": str(source), "aliases": ["default"]}]}


def _group(ranks: int, strategy: str, name: str, dirs: dict[str, Path]) -> dict[str, Any]:
    group: dict[str, Any] = {"ranks": ranks, "strategy": strategy, "heartbeat": 0.5}
    if ranks == 3:  # the group whose rank is killed last: a short bound to wait out
        group["step_timeout"] = STEP_TIMEOUT_S
    return {"distributed": group, **_served(name, dirs[name])}


@pytest.fixture(scope="module")
def reference(
    tmp_path_factory: pytest.TempPathFactory, model_cache_dir: Path, tiny_dirs: dict[str, Path]
) -> Iterator[DaemonProcess]:
    models = [
        {"name": name, "source": str(path), "dtype": "float32", "load": "on_demand"}
        for name, path in tiny_dirs.items()
    ]
    with running(tmp_path_factory.mktemp("single"), model_cache_dir, {"models": models}) as d:
        yield d


class Groups:
    """One group at a time (2 cores): asking for another stops the one running. The
    tests ask in file order: 2-rank tensor (the reload last), 3-rank, pipeline."""

    def __init__(self, directory: Path, cache_dir: Path, dirs: dict[str, Path]) -> None:
        self.directory, self.cache_dir, self.dirs = directory, cache_dir, dirs
        self._key: tuple[int, str, str] | None = None
        self._stack = contextlib.ExitStack()
        self._daemon: DaemonProcess | None = None

    def get(self, ranks: int, strategy: str, name: str) -> DaemonProcess:
        if self._key != (ranks, strategy, name) or self._daemon is None:
            self.close()
            config = _group(ranks, strategy, name, self.dirs)
            directory = self.directory / f"{ranks}-{strategy}-{name}"
            directory.mkdir()
            self._daemon = self._stack.enter_context(running(directory, self.cache_dir, config))
            self._key = (ranks, strategy, name)
        return self._daemon

    def close(self) -> None:
        self._stack.close()
        self._daemon = None


@pytest.fixture(scope="module")
def groups(
    tmp_path_factory: pytest.TempPathFactory, model_cache_dir: Path, tiny_dirs: dict[str, Path]
) -> Iterator[Groups]:
    running_groups = Groups(tmp_path_factory.mktemp("groups"), model_cache_dir, tiny_dirs)
    yield running_groups
    running_groups.close()


@pytest.fixture
def tensor2(groups: Groups) -> DaemonProcess:
    return groups.get(2, "tensor", "tiny-a")


@pytest.fixture
def tensor3(groups: Groups) -> DaemonProcess:
    return groups.get(3, "tensor", "tiny-a")


@pytest.fixture
def pipeline2(groups: Groups) -> DaemonProcess:
    return groups.get(2, "pipeline", "tiny-p")


def _openai(daemon: DaemonProcess, model: str, prompt: str, stream: bool) -> str:
    client = openai.OpenAI(base_url=f"{daemon.base_url}/v1", api_key="x", timeout=300)
    messages: Any = [{"role": "user", "content": prompt}]
    if not stream:
        reply = client.chat.completions.create(
            model=model, messages=messages, max_tokens=MAX_TOKENS, temperature=0
        )
        return reply.choices[0].message.content or ""
    chunks = client.chat.completions.create(
        model=model, messages=messages, max_tokens=MAX_TOKENS, temperature=0, stream=True
    )
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def _anthropic(daemon: DaemonProcess, model: str, prompt: str) -> str:
    client = anthropic.Anthropic(base_url=daemon.base_url, api_key="x", timeout=300)
    with client.messages.stream(
        model=model,
        max_tokens=MAX_TOKENS,
        messages=[{"role": "user", "content": prompt}],
        extra_body={"temperature": 0},
    ) as events:
        return "".join(events.text_stream)


Job = tuple[str, str]  # (how: chat | stream | anthropic, prompt)
HOWS = ("chat", "stream", "anthropic")
# Every prompt three ways: non-streaming chat, streaming chat, streaming Anthropic.
ALL_WAYS: list[Job] = [(how, prompt) for prompt in PROMPTS for how in HOWS]
# Each prompt one way, the ways in turn (3 ranks: each step costs ~0.4 s here).
ONE_WAY: list[Job] = [(HOWS[i % 3], prompt) for i, prompt in enumerate(PROMPTS)]
_expected: dict[str, dict[Job, str]] = {}  # the reference's answers, per model and job


def _replies(daemon: DaemonProcess, model: str, jobs: list[Job]) -> list[str]:
    def call(job: Job) -> str:
        how, prompt = job
        if how == "anthropic":
            return _anthropic(daemon, model, prompt)
        return _openai(daemon, model, prompt, stream=how == "stream")

    with ThreadPoolExecutor(4) as pool:  # concurrency 4: the ranks step shared batches
        return list(pool.map(call, jobs))


def _compare(
    group: DaemonProcess, reference: DaemonProcess, name: str, jobs: list[Job] = ALL_WAYS
) -> None:
    known = _expected.setdefault(name, {})
    missing = [job for job in jobs if job not in known]
    known.update(zip(missing, _replies(reference, name, missing), strict=True))
    expected = [known[job] for job in jobs]
    assert _replies(group, "default", jobs) == expected
    assert len(set(expected)) > len(PROMPTS) // 2  # the tiny model's text depends on the prompt
    assert all(expected)


def _distributed(daemon: DaemonProcess) -> dict[str, Any]:
    block: dict[str, Any] = httpx.get(f"{daemon.base_url}/v1/status", timeout=10).json()[
        "distributed"
    ]
    return block


def _bytes(path: Path, keep: Callable[[str], bool]) -> int:
    import mlx.core as mx

    weights = mx.load(str(path / "model.safetensors"))
    assert isinstance(weights, dict)
    return sum(v.nbytes for k, v in weights.items() if keep(k))


def test_two_ranks_tensor_match_the_single_process_daemon(
    tensor2: DaemonProcess, reference: DaemonProcess
) -> None:
    _compare(tensor2, reference, "tiny-a")


def test_two_ranks_tensor_each_hold_half_the_layers(
    tensor2: DaemonProcess, tiny_dirs: dict[str, Path]
) -> None:
    status = _distributed(tensor2)
    assert status["size"] == 2 and status["strategy"] == "tensor"
    layers = _bytes(tiny_dirs["tiny-a"], lambda k: ".layers." in k)
    rest = _bytes(tiny_dirs["tiny-a"], lambda k: ".layers." not in k)  # embedding, lm_head
    for rank in status["ranks"]:
        assert rank["weight_bytes"] == pytest.approx(rest + layers / 2, rel=0.01)


def test_a_model_change_in_the_file_reshards_every_rank(
    tensor2: DaemonProcess, reference: DaemonProcess, tiny_dirs: dict[str, Path]
) -> None:
    """tiny-a -> tiny-b (another seed) in the YAML of the running group, then SIGHUP (a
    model key waits for one) to `serve`, which passes it to rank 0: every rank loads
    and shards tiny-b, and rank 0 serves it (the group is not restarted)."""
    pid = tensor2.process.pid
    settings = yaml.safe_load(tensor2.config_path.read_text())
    settings["models"][0]["source"] = str(tiny_dirs["tiny-b"])
    _write(tensor2.config_path, settings)
    wait_for(lambda: bool(_log_events(tensor2, "config changes pending")), 60, "the change")
    switched, streaming = threading.Event(), threading.Event()
    with ThreadPoolExecutor(2) as pool:
        # A long generation in flight as the reload starts finishes on the old model. Its
        # first token is the sign it is running, with LONG_TOKENS - 1 steps to go (polling
        # /v1/status could miss a short one on a loaded machine: it was done in one poll).
        long = pool.submit(_long_completion, tensor2, "default", streaming)
        assert streaming.wait(60), "the long generation did not start"
        tensor2.process.send_signal(signal.SIGHUP)
        answers = pool.submit(_ask_until, tensor2, switched)  # requests all through it
        wait_for(lambda: bool(_log_events(tensor2, "models switched")), 120, "the re-shard")
        switched.set()
        # Each answered by a model, or refused while the ranks re-shard: a 503, or in a
        # stream (its headers are out at once) an error event.
        for code, body in answers.result():
            assert code in (200, 503), (code, body)
            assert '"error"' not in body or "re-sharded" in body, body
            assert code == 200 or "re-sharded" in body, body
        assert long.result() == _long_completion(reference, "tiny-a")
    group = _distributed(tensor2)
    assert group["loads"] == 2 and group["state"] == "serving"
    # Each rank's own record of the model it sharded (gathered in the load's barrier).
    assert [r["model"] for r in group["ranks"]] == [f"tiny {tiny_dirs['tiny-b']}"] * 2
    _compare(tensor2, reference, "tiny-b", ONE_WAY)
    assert tensor2.process.poll() is None and tensor2.process.pid == pid
    assert len(_log_events(tensor2, "rank 0 reloads the model")) == 1  # the one follower


def test_a_reload_failing_after_the_reshard_fails_the_group(
    tensor2: DaemonProcess, tiny_dirs: dict[str, Path]
) -> None:
    """Back to tiny-a, and a new port that is taken: the ranks re-shard, then the new
    listener fails. The old engine is closed and the followers hold tiny-a, so there is
    nothing to go back to: the group fails and exits 70 (the service manager restarts
    it on the new config). (It runs after the reload test, on its group.)"""
    settings = yaml.safe_load(tensor2.config_path.read_text())
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        settings["models"][0]["source"] = str(tiny_dirs["tiny-a"])
        settings["server"]["port"] = taken.getsockname()[1]
        pending = len(_log_events(tensor2, "config changes pending"))
        _write(tensor2.config_path, settings)
        wait_for(
            lambda: len(_log_events(tensor2, "config changes pending")) > pending, 60, "the change"
        )
        tensor2.process.send_signal(signal.SIGHUP)
        assert tensor2.process.wait(60) == 70
    assert "the reload failed after the group re-sharded" in tensor2.log_text()


def _write(path: Path, settings: dict[str, Any]) -> None:
    scratch = path.with_suffix(".tmp")
    scratch.write_text(yaml.safe_dump(settings, sort_keys=False))
    os.replace(scratch, path)


def test_three_ranks_tensor_match_the_single_process_daemon(
    tensor3: DaemonProcess, reference: DaemonProcess
) -> None:
    _compare(tensor3, reference, "tiny-a", ONE_WAY)


def test_every_rank_uses_the_token_rank_0_sampled(tensor3: DaemonProcess) -> None:
    """temperature 1 without a seed: ranks sampling on their own would diverge."""
    client = openai.OpenAI(base_url=f"{tensor3.base_url}/v1", api_key="x", timeout=300)
    reply = client.completions.create(
        model="default", prompt="Once upon a time", max_tokens=MAX_TOKENS, temperature=1.0
    )
    text = reply.choices[0].text
    mine = _follower_records(tensor3, reply.id, 3)
    assert sorted(e["rank"] for e in mine) == [1, 2]
    assert all(e["text"] == text and e["tokens"] == reply.usage.completion_tokens for e in mine)


def test_structured_output_is_enforced_on_rank_0_and_shared(tensor3: DaemonProcess) -> None:
    """The grammar mask runs on rank 0 only; the followers still follow its tokens."""
    client = openai.OpenAI(base_url=f"{tensor3.base_url}/v1", api_key="x", timeout=300)
    reply = client.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": "Tea or coffee?"}],
        max_tokens=MAX_TOKENS,
        temperature=1.0,
        extra_body={"structured_outputs": {"choice": ["tea", "coffee"]}},
    )
    assert reply.choices[0].message.content in ("tea", "coffee")
    mine = _follower_records(tensor3, reply.id, 3)
    assert sorted(e["rank"] for e in mine) == [1, 2]
    assert all(e["text"] == reply.choices[0].message.content for e in mine)


def test_a_killed_rank_fails_the_stream_and_the_group_exits(tensor3: DaemonProcess) -> None:
    """SIGKILL to a follower once a token is out: the stream ends with a clear error and
    the group exits 70 within step_timeout + 1.25 s (plus slack). It ends the 3-rank
    group, so it runs last on it."""
    follower = _log_events(tensor3, "following rank 0")[0]
    body = {
        "model": "default",
        "prompt": "Once upon a time",
        "max_tokens": 1000,
        "stream": True,
    }
    lines: list[str] = []
    killed = False
    with httpx.stream(
        "POST", f"{tensor3.base_url}/v1/completions", json=body, timeout=300
    ) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            lines.append(line)
            if not killed and '"text":"' in line and '"text":""' not in line:
                os.kill(follower["pid"], signal.SIGKILL)  # mid-stream: a token is out
                killed = True
    text = "\n".join(lines)
    assert killed  # tokens streamed before the failure
    assert "distributed group failed" in text  # the stream ends with a clear error
    assert tensor3.process.wait(KILL_BOUND_S) == 70


def test_two_ranks_pipeline_match_the_single_process_daemon(
    pipeline2: DaemonProcess, reference: DaemonProcess, tiny_dirs: dict[str, Path]
) -> None:
    _compare(pipeline2, reference, "tiny-p")
    status = _distributed(pipeline2)
    assert status["strategy"] == "pipeline" and status["state"] == "serving"
    # One layer of the two each; the embedding, norm and lm_head stay on every rank.
    layer0 = _bytes(tiny_dirs["tiny-p"], lambda k: ".layers.0." in k)
    rest = _bytes(tiny_dirs["tiny-p"], lambda k: ".layers." not in k)
    for rank in status["ranks"]:
        assert rank["weight_bytes"] == pytest.approx(rest + layer0, rel=0.01)


def _log_events(daemon: DaemonProcess, event: str) -> list[dict[str, Any]]:
    lines = daemon.log_text().splitlines()
    return [json.loads(x) for x in lines if x.startswith("{") and f'"{event}"' in x]


def _follower_records(daemon: DaemonProcess, request_id: str, ranks: int) -> list[dict[str, Any]]:
    """Each follower's log of the sequence; the lines come through mlx.launch's relay."""
    mine: list[dict[str, Any]] = []

    def logged() -> bool:
        finished = _log_events(daemon, "follower sequence finished")
        mine[:] = [e for e in finished if e["request_id"] == request_id]
        return len(mine) == ranks - 1

    wait_for(logged, 60, "every follower's record of the sequence")
    return mine


def _ask_until(daemon: DaemonProcess, done: threading.Event) -> list[tuple[int, str]]:
    """Completions, streamed and not in turn, until `done`: (status, body) each."""
    answers: list[tuple[int, str]] = []
    while not done.is_set():
        stream = len(answers) % 2 == 1
        body = {"model": "default", "prompt": "Hi", "max_tokens": 2, "stream": stream}
        reply = httpx.post(f"{daemon.base_url}/v1/completions", json=body, timeout=120)
        answers.append((reply.status_code, reply.text))
    return answers


def _long_completion(
    daemon: DaemonProcess, model: str, streaming: threading.Event | None = None
) -> str:
    """A greedy completion of LONG_TOKENS, streamed; `streaming` is set at its first text."""
    body = {
        "model": model,
        "prompt": "Once upon a time",
        "max_tokens": LONG_TOKENS,
        "temperature": 0,
        "stream": True,
    }
    pieces: list[str] = []
    finish: list[str] = []
    with httpx.stream("POST", f"{daemon.base_url}/v1/completions", json=body, timeout=300) as reply:
        assert reply.status_code == 200, reply.read()
        for line in reply.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line.removeprefix("data: "))
            assert "error" not in chunk, chunk
            pieces.extend(choice["text"] for choice in chunk["choices"])
            finish.extend(c["finish_reason"] for c in chunk["choices"] if c["finish_reason"])
            if streaming is not None and "".join(pieces):
                streaming.set()
    assert finish == ["length"], finish  # it ran all its steps (no early end of text)
    return "".join(pieces)
