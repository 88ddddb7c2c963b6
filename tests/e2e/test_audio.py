"""/v1/audio/transcriptions and /v1/audio/translations on a real daemon, through the
official OpenAI SDK, on speech synthesised here with espeak-ng.

Ten known sentences are spoken (en-us, 150 words a minute) and joined with a second of
silence into one 36 s file: two of Whisper's 30 s windows, so a seam falls inside the
speech. The bundled tiny.en must transcribe it with a word error rate under 0.15
(measured here: 0.04, "the weather is" heard as "wherever is", "cup of" as "cup
and"), and its text must equal mlx-whisper's own `transcribe` on the same array with
the same settings (run in a fresh process beside the daemon). Every response format,
streamed and not, is asked for on the first sentence alone (one window each).
"""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import sys
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import av
import httpx
import numpy as np
import openai
import pytest

from tests.conftest import DaemonProcess, running
from tests.e2e.ops_support import scrape, value
from vllm_mlx.api.audio.decode import decode_audio
from vllm_mlx.models.sources import builtin_path
from vllm_mlx.models.whisper_import import import_ctranslate2_whisper

ROOT = Path(__file__).resolve().parents[2]
MODEL = "whisper-tiny-en"
CHAT = "chat"
SENTENCES = [
    "The weather is nice today.",
    "Please open the window before you leave.",
    "I would like a cup of hot coffee.",
    "My brother lives in a small house near the river.",
    "We are going to the market on Saturday morning.",
    "She reads a book every night before bed.",
    "The train arrives at seven o'clock.",
    "Can you tell me where the station is?",
    "The children played in the park all afternoon.",
    "Thank you very much for your help.",
]
MAX_WER = 0.15
SHORT = SENTENCES[1]  # transcribed word for word by tiny.en


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower())


def word_error_rate(reference: str, hypothesis: str) -> float:
    ref, hyp = words(reference), words(hypothesis)
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        previous, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (r != h))
    return row[-1] / len(ref)


def speak(text: str, path: Path) -> np.ndarray:
    subprocess.run(["espeak-ng", "-v", "en-us", "-s", "150", "-w", str(path), text], check=True)
    return decode_audio(path.read_bytes(), 60).samples


def write_wav(samples: np.ndarray, path: Path) -> Path:
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(16_000)
        out.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())
    return path


@pytest.fixture(scope="module")
def audio(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if shutil.which("espeak-ng") is None:
        pytest.fail("espeak-ng is missing: ./install.sh --dev installs it")
    base = tmp_path_factory.mktemp("speech")
    spoken = [speak(text, base / f"{i}.wav") for i, text in enumerate(SENTENCES)]
    silence = np.zeros(16_000, np.float32)
    joined = np.concatenate([part for s in spoken for part in (s, silence)])
    return {"long": write_wav(joined, base / "long.wav"), "short": base / "1.wav"}


@pytest.fixture(scope="module")
def reference(audio: dict[str, Path], model_cache_dir: Path) -> Iterator[subprocess.Popen[str]]:
    """mlx-whisper's own transcript of the long file, computed while the tests run."""
    imported = import_ctranslate2_whisper(builtin_path(MODEL), model_cache_dir)
    command = [sys.executable, "-m", "tests.support.whisper_reference", "transcribe",
               str(imported), str(audio["long"])]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    yield process
    process.kill()


@pytest.fixture(scope="module")
def daemon(
    tmp_path_factory: pytest.TempPathFactory, model_cache_dir: Path
) -> Iterator[DaemonProcess]:
    config = {
        "models": [
            {"name": MODEL, "source": f"builtin:{MODEL}", "task": "transcribe"},
            {"name": CHAT, "source": "builtin:smollm2-135m-instruct", "load": "on_demand"},
        ],
        "metrics": {"enabled": True},
        "limits": {"max_audio_mb": 2.0, "max_audio_seconds": 60},
    }
    with running(tmp_path_factory.mktemp("audio"), model_cache_dir, config) as process:
        yield process


@pytest.fixture(scope="module")
def client(daemon: DaemonProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{daemon.base_url}/v1", api_key="unused", max_retries=0)


def test_long_file_windows_and_reference(
    client: openai.OpenAI, audio: dict[str, Path], reference: subprocess.Popen[str]
) -> None:
    with audio["long"].open("rb") as f:
        done = client.audio.transcriptions.create(model=MODEL, file=f)
    wer = word_error_rate(" ".join(SENTENCES), done.text)
    assert wer < MAX_WER, (wer, done.text)
    assert words(done.text)[-4:] == ["much", "for", "your", "help"]  # past the seam
    out, _ = reference.communicate(timeout=240)
    assert reference.returncode == 0
    assert done.text == json.loads(out.strip().splitlines()[-1])["text"].strip()


def test_every_format(client: openai.OpenAI, audio: dict[str, Path]) -> None:
    short = audio["short"].read_bytes()
    text = client.audio.transcriptions.create(
        model=MODEL, file=("a.wav", short), response_format="text"
    )
    assert text == SHORT + "\n"
    srt = client.audio.transcriptions.create(
        model=MODEL, file=("a.wav", short), response_format="srt"
    )
    assert re.fullmatch(rf"1\n00:00:00,000 --> 00:00:0\d,\d{{3}}\n{re.escape(SHORT)}\n", srt)
    vtt = client.audio.transcriptions.create(
        model=MODEL, file=("a.wav", short), response_format="vtt"
    )
    assert re.fullmatch(rf"WEBVTT\n\n00:00:00.000 --> 00:00:0\d.\d{{3}}\n{re.escape(SHORT)}\n", vtt)
    verbose = client.audio.transcriptions.create(
        model=MODEL,
        file=("a.wav", short),
        response_format="verbose_json",
        timestamp_granularities=["word", "segment"],
    )
    assert verbose.text == SHORT and verbose.language == "english"
    seconds = len(decode_audio(short, 60).samples) / 16_000
    assert verbose.duration == pytest.approx(seconds, abs=5e-4)  # rounded to ms
    assert verbose.segments is not None and len(verbose.segments) == 1
    assert verbose.segments[0].start == 0.0 and verbose.segments[0].end <= verbose.duration
    assert verbose.words is not None and [w.word for w in verbose.words] == SHORT.split()
    starts = [w.start for w in verbose.words]
    assert starts == sorted(starts) and all(w.end >= w.start for w in verbose.words)


def test_streamed(client: openai.OpenAI, audio: dict[str, Path]) -> None:
    stream = client.audio.transcriptions.create(
        model=MODEL, file=("a.wav", audio["short"].read_bytes()), stream=True
    )
    events = list(stream)
    deltas = [e.delta for e in events if e.type == "transcript.text.delta"]
    done = events[-1]
    assert done.type == "transcript.text.done" and done.text == SHORT == "".join(deltas)
    assert done.usage is not None and done.usage.type == "tokens"
    assert done.usage.output_tokens > 0 and done.usage.total_tokens > done.usage.output_tokens


def error_of(response: httpx.Response, status: int = 400) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    assert error["type"] == "invalid_request_error" or status != 400
    return error


def post(daemon: DaemonProcess, path: str, data: dict[str, Any], file: bytes) -> httpx.Response:
    files = {"file": ("upload.bin", file)}
    return httpx.post(f"{daemon.base_url}{path}", data=data, files=files, timeout=120)


def test_bad_inputs(daemon: DaemonProcess, audio: dict[str, Path]) -> None:
    transcribe = "/v1/audio/transcriptions"
    short = audio["short"].read_bytes()
    silent = write_wav(np.zeros(0, np.float32), audio["short"].parent / "empty.wav").read_bytes()
    cases: list[tuple[str, dict[str, Any], bytes, str, str]] = [
        (transcribe, {"model": MODEL}, b"", "file", "empty_file"),
        (transcribe, {"model": MODEL}, b"RIFF\x00\x00garbage" * 50, "file", "invalid_audio"),
        (transcribe, {"model": MODEL}, b"%PDF-1.4 not audio\n" * 50, "file", "invalid_audio"),
        (transcribe, {"model": MODEL}, silent, "file", "empty_audio"),
        (transcribe, {"model": MODEL}, short[: len(short) // 3] + b"\xff" * 999, "", ""),
        (transcribe, {"model": MODEL, "response_format": "mp3"}, short, "response_format", ""),
        (transcribe, {"model": MODEL, "language": "fr"}, short, "language",
         "unsupported_language"),
        (transcribe, {"model": MODEL, "temperature": "2"}, short, "temperature", ""),
        (transcribe, {"model": CHAT}, short, "model", "model_not_transcriber"),
        ("/v1/audio/translations", {"model": MODEL}, short, "model", "translation_unsupported"),
    ]  # fmt: skip
    for path, data, file, param, code in cases:
        response = post(daemon, path, data, file)
        if not param:  # a truncated wav with junk at the end: served or refused, never a 500
            assert response.status_code in (200, 400), response.text
            continue
        error = error_of(response)
        assert error["param"] == param, (data, error)
        if code:
            assert error["code"] == code, error
    assert "English-only" in error_of(post(daemon, transcribe, cases[6][1], short))["message"]
    too_big = error_of(post(daemon, transcribe, {"model": MODEL}, b"\0" * (3 << 20)), 413)
    assert too_big["param"] == "file" and "max_audio_mb" in too_big["message"]
    assert httpx.get(f"{daemon.base_url}/health", timeout=10).status_code == 200


def flac_silence(seconds: float) -> bytes:
    """Silence compresses to almost nothing: long audio inside max_audio_mb."""
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="flac") as out:
        stream = out.add_stream("flac", rate=16_000, layout="mono")
        samples = np.zeros((1, int(seconds * 16_000)), np.int16)
        frame = av.AudioFrame.from_ndarray(samples, "s16", "mono")
        frame.sample_rate = 16_000
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            out.mux(packet)
    return buffer.getvalue()


def test_too_long_and_models_and_metrics(daemon: DaemonProcess) -> None:
    data = flac_silence(61)  # limits.max_audio_seconds is 60
    assert len(data) < 2 << 20
    error = error_of(post(daemon, "/v1/audio/transcriptions", {"model": MODEL}, data))
    assert error["param"] == "file" and error["code"] == "audio_too_long"
    cards = httpx.get(f"{daemon.base_url}/v1/models", timeout=10).json()["data"]
    card = next(c for c in cards if c["id"] == MODEL)
    assert card["task"] == "transcribe"
    metrics = scrape(daemon)
    assert value(metrics, "vllm_mlx_audio_requests_total", model_name=MODEL) >= 4
    assert value(metrics, "vllm_mlx_audio_seconds_total", model_name=MODEL) > 36
