"""Hugging Face hub sources, resolved offline from a pre-seeded cache (no network here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_mlx.config.file import load_settings
from vllm_mlx.config.model import ModelSettings
from vllm_mlx.models.loader import ModelUnavailableError, describe_models, resolve_model_dir
from vllm_mlx.models.sources import SourceKind, classify_source

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def seed_hub_cache(cache: Path, repo: str) -> Path:
    """The layout huggingface-hub itself writes: models--org--name/{refs,snapshots}."""
    root = cache / f"models--{repo.replace('/', '--')}"
    snapshot = root / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(COMMIT)
    (snapshot / "config.json").write_text(
        json.dumps({"model_type": "llama", "max_position_embeddings": 2048})
    )
    (snapshot / "model.safetensors").write_bytes(b"")
    return snapshot


@pytest.fixture
def offline_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return cache


def test_repo_id_is_classified_as_hub() -> None:
    assert classify_source("mlx-community/Qwen3-0.6B-4bit").kind is SourceKind.HF_REPO


def test_cached_repo_resolves_offline_to_its_snapshot(offline_hub: Path, tmp_path: Path) -> None:
    snapshot = seed_hub_cache(offline_hub, "test-org/tiny")
    model = ModelSettings(name="tiny", source="test-org/tiny")
    assert resolve_model_dir(model, tmp_path) == snapshot


def test_missing_repo_offline_is_a_clear_error(offline_hub: Path, tmp_path: Path) -> None:
    model = ModelSettings(name="x", source="test-org/absent")
    with pytest.raises(ModelUnavailableError, match="test-org/absent is not in the Hugging Face"):
        resolve_model_dir(model, tmp_path)


def test_models_command_lists_cached_and_missing(offline_hub: Path, tmp_path: Path) -> None:
    snapshot = seed_hub_cache(offline_hub, "test-org/tiny")
    config = tmp_path / "c.yaml"
    config.write_text(
        "models:\n  - name: tiny\n    source: test-org/tiny\n"
        "  - name: gone\n    source: test-org/absent\n"
    )
    rows = describe_models(load_settings(config))
    assert [(r["name"], r["kind"], r["directory"]) for r in rows] == [
        ("tiny", "hf", str(snapshot)),
        ("gone", "hf", None),
    ]
