"""Resolve a configured model source to an mlx-lm directory and load it."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from vllm_mlx.config.model import ModelSettings
from vllm_mlx.config.sections import EngineSettings
from vllm_mlx.config.settings import Settings
from vllm_mlx.models.loaded import LoadedEmbeddingModel, LoadedModel
from vllm_mlx.models.sources import SourceKind, builtin_path, classify_source
from vllm_mlx.models.speech import LoadedSpeechModel
from vllm_mlx.models.vision import vision_config_of

if TYPE_CHECKING:
    from vllm_mlx.models.dtype import DtypeDecision

log = structlog.get_logger(__name__)

# Files an mlx-lm model needs; everything else in a hub repo (PyTorch weights,
# ONNX exports, images) is skipped so downloads stay as small as the model.
HUB_PATTERNS = [
    "*.json",
    "*.safetensors",
    "*.jinja",
    "*.txt",
    "*.model",
    "*.tiktoken",
    "*.py",
]

DEFAULT_CONTEXT = 4096


class ModelUnavailableError(RuntimeError):
    """A model's files cannot be had (not cached and not downloadable)."""


def resolve_model_dir(model: ModelSettings, cache_dir: Path) -> Path:
    """The local mlx-lm directory for this model, importing or downloading as needed."""
    source = classify_source(model.source)
    if source.kind is SourceKind.LOCAL_DIR:
        return source.path
    if source.kind in (SourceKind.BUILTIN, SourceKind.GGUF_FILE):
        from vllm_mlx.models.gguf import import_gguf

        gguf = builtin_path(source.value) if source.kind is SourceKind.BUILTIN else source.path
        if gguf.is_dir():  # a builtin shipped as a model folder (the embedding model)
            return gguf
        return import_gguf(gguf, cache_dir)
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    # snapshot_download shows a progress bar and honours HF_HUB_OFFLINE / the HF cache.
    try:
        path = snapshot_download(source.value, revision=model.revision, allow_patterns=HUB_PATTERNS)
    except LocalEntryNotFoundError as exc:
        raise ModelUnavailableError(
            f"{source.value} is not in the Hugging Face cache and cannot be downloaded "
            f"(HF_HUB_OFFLINE is set or the hub is unreachable)"
        ) from exc
    return Path(path)


def context_length_of(model_dir: Path, override: int | None) -> int:
    if override is not None:
        return override
    return context_length_in(json.loads((model_dir / "config.json").read_text()))


def context_length_in(config: dict[str, Any]) -> int:
    """The context a model's config.json declares (DEFAULT_CONTEXT when it names none)."""
    for key in ("max_position_embeddings", "max_seq_len", "n_positions", "seq_length"):
        value = config.get(key) or config.get("text_config", {}).get(key)
        if isinstance(value, int) and value > 0:
            return value
    return DEFAULT_CONTEXT


def load_model(
    model: ModelSettings,
    cache_dir: Path,
    engine: EngineSettings | None = None,
    draft: ModelSettings | None = None,
) -> LoadedModel | LoadedEmbeddingModel | LoadedSpeechModel:
    """The model in memory: an mlx-lm model, an embedding model for `task: embed`, a
    Whisper model for `task: transcribe`. `draft`: a generation model's draft model
    (models/draft.py), loaded beside it."""
    if model.task == "embed":
        from vllm_mlx.models.embedding import load_embedding_model

        return load_embedding_model(model, resolve_model_dir(model, cache_dir), engine)
    if model.task == "rerank":
        return load_reranker(model, cache_dir, engine)
    if model.task == "transcribe":
        from vllm_mlx.models.speech import load_speech_model, speech_model_dir

        resolved = resolve_model_dir(model, cache_dir)
        return load_speech_model(model, speech_model_dir(model, resolved, cache_dir))
    loaded = load_generation_model(model, cache_dir, engine)
    if draft is not None:
        loaded.draft = load_draft(model, draft, loaded, cache_dir, engine)
    return loaded


def load_draft(
    model: ModelSettings,
    draft: ModelSettings,
    target: LoadedModel,
    cache_dir: Path,
    engine: EngineSettings | None = None,
) -> LoadedModel:
    """`model`'s draft model, refused (ValueError) unless it has the target's tokenizer."""
    from vllm_mlx.models.draft import refusal, tokenizer_mismatch

    loaded = load_generation_model(draft, cache_dir, engine)
    why = tokenizer_mismatch(target.tokenizer, loaded.tokenizer)
    if why is not None:
        raise ValueError(refusal(model, draft, why))
    return loaded


def load_reranker(
    model: ModelSettings, cache_dir: Path, engine: EngineSettings | None = None
) -> LoadedEmbeddingModel:
    """A `task: rerank` model as the embedding engine runs it (docs/rerank.md)."""
    from vllm_mlx.models.rerank import rerank_method_of

    model_dir = resolve_model_dir(model, cache_dir)
    method = rerank_method_of(model_dir, model.rerank_method)
    if method == "cross_encoder":
        from vllm_mlx.models.cross_encoder import load_cross_encoder

        return load_cross_encoder(model, model_dir, engine)
    if method == "embedding":
        from vllm_mlx.models.embedding import load_embedding_model

        return replace(load_embedding_model(model, model_dir, engine), rerank_method="embedding")
    from vllm_mlx.models.llm_scorer import llm_rerank_model

    return llm_rerank_model(load_generation_model(model, cache_dir, engine), model, engine)


def load_generation_model(
    model: ModelSettings, cache_dir: Path, engine: EngineSettings | None = None
) -> LoadedModel:
    started = time.monotonic()
    model_dir = resolve_model_dir(model, cache_dir)
    is_vlm = vision_config_of(model_dir) is not None
    if model.vision and not is_vlm:
        raise ValueError(f"{model_dir} is not a vision-language model (no vision_config)")
    tower = None
    if is_vlm:  # the text model from mlx-vlm's weights; `vision: false` drops the tower
        weights, tokenizer, tower = _load_vlm(model_dir)
        tower = None if model.vision is False else tower
    else:
        from mlx_lm.utils import load

        weights, tokenizer = load(str(model_dir))[:2]
    weights, decision, blas_fields = _apply_dtype(weights, model)
    from vllm_mlx.models.cpu import pool_policy

    # How eagerly the kernel's pool splits: named, or measured once a process.
    pool_policy.choose(weights, engine.kernel_pool if engine else "auto")
    if tower is not None:
        from vllm_mlx.models.vision_model import install_placeholder_embedding

        install_placeholder_embedding(weights, tower)
    elapsed = time.monotonic() - started
    log.info(
        "model loaded",
        model=model.name,
        directory=str(model_dir),
        seconds=round(elapsed, 2),
        dtype=decision.chosen,
        path=decision.path,
        dtype_reason=decision.reason,
        **blas_fields,
    )
    return LoadedModel(
        name=model.name,
        model=weights,
        tokenizer=tokenizer,
        context_length=context_length_of(model_dir, model.context_length),
        directory=str(model_dir),
        load_seconds=elapsed,
        vision=tower,
    )


def _load_vlm(model_dir: Path) -> tuple[Any, Any, Any]:
    """(text model, mlx-lm tokenizer, tower) of a vision-language model directory."""
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    from vllm_mlx.models.vision_model import load_vision_model

    config = json.loads((model_dir / "config.json").read_text())
    text_model, tower = load_vision_model(model_dir, config)
    eos = config.get("eos_token_id") or config.get("text_config", {}).get("eos_token_id")
    eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
    eos_ids += list(getattr(tower.processor, "additional_eos_token_ids", None) or [])
    tokenizer = load_tokenizer(model_dir, eos_token_ids=eos_ids)
    template = getattr(tower.processor, "chat_template", None)
    hf = getattr(tokenizer, "_tokenizer", tokenizer)
    if template and not getattr(hf, "chat_template", None):
        hf.chat_template = template  # VLM repos keep it in chat_template.json
    return text_model, tokenizer, tower


def _apply_dtype(weights: Any, model: ModelSettings) -> tuple[Any, DtypeDecision, dict[str, str]]:
    """The configured weight format (`auto` needs to know whether BLAS is optimized), and
    the BLAS for the load log."""
    from vllm_mlx.models.cpu import blas
    from vllm_mlx.models.dtype import apply_dtype

    choice = blas.active()
    optimized = choice is not None and choice.optimized
    weights, decision = apply_dtype(
        weights, model.dtype, blas_optimized=optimized, int8_activations=model.int8_activations
    )
    if choice is None:
        return weights, decision, {"blas": "not chosen"}
    name = f"{choice.name} ({choice.core})" if choice.core else choice.name
    return weights, decision, {"blas": name, "blas_reason": choice.reason}


def describe_models(settings: Settings, resolve: bool = False) -> list[dict[str, Any]]:
    """Configured models with their local directory (None when a hub model is not cached).

    Local sources (builtin, GGUF, directories) always resolve: importing a GGUF is
    local work. Hub models are only downloaded when `resolve` is true.
    """
    rows = []
    cache_dir = settings.resolved_cache_dir()
    for model in settings.models:
        kind = classify_source(model.source).kind
        directory: Path | None
        if kind is SourceKind.HF_REPO and not resolve:
            directory = cached_hub_dir(model)
        else:
            directory = resolve_model_dir(model, cache_dir)
        rows.append(
            {
                "name": model.name,
                "aliases": list(model.aliases),
                "task": model.task,
                "source": model.source,
                "kind": kind.value,
                "directory": str(directory) if directory else None,
                "vision": _accepts_images(model, directory),
                **_planned_path(model, directory),
            }
        )
    return rows


def _accepts_images(model: ModelSettings, directory: Path | None) -> bool | None:
    """Whether the model will take images: a `vision_config` in its config.json, unless
    `vision: false` (None while a hub model is not downloaded: its config is unknown)."""
    if model.task != "generate" or model.vision is False:
        return False
    if directory is None:
        return None
    return vision_config_of(directory) is not None


def _planned_path(model: ModelSettings, directory: Path | None) -> dict[str, str | None]:
    """`path`: what the model will compute on (`quantized+kernel`, `float32`, ...)."""
    if directory is None or not (directory / "config.json").is_file():
        return {"path": None, "path_reason": "not downloaded yet"}
    from vllm_mlx.models.cpu import blas
    from vllm_mlx.models.plan import planned

    choice = blas.active()
    decision = planned(model, directory, blas_optimized=choice is not None and choice.optimized)
    return {"path": decision.path, "path_reason": decision.reason}


def cached_hub_dir(model: ModelSettings) -> Path | None:
    """The hub model's snapshot if the Hugging Face cache holds it; None otherwise (never
    downloads: check-config and `models` only look)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(
            snapshot_download(
                model.source,
                revision=model.revision,
                allow_patterns=HUB_PATTERNS,
                local_files_only=True,
            )
        )
    except LocalEntryNotFoundError:
        return None
