"""`vllm-mlx models --json`: stdout is only the JSON (logs go to stderr)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_models_json_is_machine_readable(tmp_path: Path, model_cache_dir: Path) -> None:
    config = tmp_path / "vllm-mlx.yaml"
    config.write_text(f"paths:\n  cache_dir: {model_cache_dir}\n")
    command = [sys.executable, "-m", "vllm_mlx.cli", "models", "--config", str(config), "--json"]
    done = subprocess.run(command, capture_output=True, text=True, check=True, timeout=120)
    row, embedding, speech = json.loads(done.stdout)
    assert row["name"] == "smollm2-135m-instruct" and row["aliases"] == ["default"]
    assert row["task"] == "generate"
    assert (Path(row["directory"]) / "config.json").is_file()
    # The path it will compute on, without loading it: the kernel when it is built.
    assert row["path"] in ("quantized+kernel", "float32", "quantized") and row["path_reason"]
    if sys.platform == "linux":
        assert row["path"] == "quantized+kernel", row["path_reason"]
    # The bundled embedding model is served by default too, straight from its package.
    assert embedding["name"] == "all-minilm-l6-v2" and embedding["task"] == "embed"
    assert (Path(embedding["directory"]) / "model.safetensors").is_file()
    # And the bundled Whisper tiny.en, in the CTranslate2 format it is imported from.
    assert speech["name"] == "whisper-tiny-en" and speech["task"] == "transcribe"
    assert (Path(speech["directory"]) / "model.bin").is_file()
