"""The CTranslate2 -> mlx-whisper import of the bundled Whisper tiny.en, against
CTranslate2 itself running the original `model.bin` (test-only dependency, CPU).

Both run the same log-mel window of espeak-ng speech. The stored weights are float16
and both compute in float32, in other summation orders: the encoder outputs (max |x|
about 12) agree within 0.05 absolute (measured: 0.0099), and greedy decoding gives
the same tokens.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_mlx.models.sources import builtin_path
from vllm_mlx.models.whisper_import import (
    DIGEST_MEMO_DIR,
    WhisperImportError,
    import_ctranslate2_whisper,
    read_ctranslate2,
)

ROOT = Path(__file__).resolve().parents[2]
ENCODER_TOLERANCE = 0.05
KERNEL_TOLERANCE = 0.01


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return import_ctranslate2_whisper(builtin_path("whisper-tiny-en"), tmp_path_factory.mktemp("w"))


def test_import_is_cached_and_complete(imported: Path, tmp_path: Path) -> None:
    config = json.loads((imported / "config.json").read_text())
    assert config == {
        "model_type": "whisper", "n_mels": 80, "n_audio_ctx": 1500, "n_audio_state": 384,
        "n_audio_head": 6, "n_audio_layer": 4, "n_vocab": 51864, "n_text_ctx": 448,
        "n_text_state": 384, "n_text_head": 6, "n_text_layer": 4,
    }  # fmt: skip
    stamp = (imported / "weights.safetensors").stat().st_mtime_ns
    again = import_ctranslate2_whisper(builtin_path("whisper-tiny-en"), imported.parents[1])
    assert again == imported and (again / "weights.safetensors").stat().st_mtime_ns == stamp
    # model.bin's hash is remembered beside the imports (tests/unit/test_file_digest.py).
    assert len(list((imported.parents[1] / DIGEST_MEMO_DIR).iterdir())) == 1


def test_bad_model_bin_is_refused(tmp_path: Path) -> None:
    source = builtin_path("whisper-tiny-en")
    (tmp_path / "model.bin").write_bytes((source / "model.bin").read_bytes()[:5000])
    with pytest.raises(WhisperImportError, match="truncated"):
        read_ctranslate2(tmp_path / "model.bin")
    (tmp_path / "model.bin").write_bytes(b"\x63\x00\x00\x00" + b"\x00" * 16)
    with pytest.raises(WhisperImportError, match="version 99"):
        import_ctranslate2_whisper(tmp_path, tmp_path / "cache")
    assert not any((tmp_path / "cache" / "whisper").iterdir())  # nothing half-written left


def test_equal_to_ctranslate2(imported: Path, tmp_path: Path) -> None:
    if shutil.which("espeak-ng") is None:
        pytest.fail("espeak-ng is missing: ./install.sh --dev installs it")
    wav = tmp_path / "speech.wav"
    subprocess.run(
        ["espeak-ng", "-v", "en-us", "-s", "150", "-w", str(wav),
         "Please open the window before you leave."],
        check=True,
    )  # fmt: skip
    out = subprocess.run(
        [sys.executable, "-m", "tests.support.whisper_reference", "encoder",
         str(builtin_path("whisper-tiny-en")), str(imported), str(wav)],
        check=True, capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["max_abs"] < ENCODER_TOLERANCE, found
    assert found["scale"] > 1.0  # a real activation, not zeros on both sides
    assert found["mlx_tokens"] == found["ct2_tokens"] and len(found["mlx_tokens"]) >= 5
    # The threaded softmax the daemon routes the encoder through on the CPU: the same
    # activations to rounding (measured: 0.0013 of ~13), far inside the import's bound.
    if sys.platform == "linux":
        assert found["kernel_routed"], "the CPU kernel is not built: ./install.sh builds it"
    assert found["kernel_max_abs"] < KERNEL_TOLERANCE, found
