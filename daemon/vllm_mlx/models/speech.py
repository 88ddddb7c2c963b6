"""Speech-to-text models (`task: transcribe`): Whisper checkpoints run by mlx-whisper.

A model is an mlx-whisper directory (`config.json` + `weights.safetensors` or
`weights.npz`) from a Hugging Face repo or a local path, or the bundled tiny.en, shipped
in CTranslate2's format and imported once (models/whisper_import.py). Decoding is
mlx-whisper's own `transcribe` (30 s windows, temperature fallback, timestamps, word
alignment), on the model's engine thread (engine/speech_runner.py).

mlx-whisper's `transcribe` takes its model from a process-wide holder keyed by path,
not as an argument, so each call sets the holder to the model it runs, under one lock:
two Whisper models never swap the holder under each other.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from vllm_mlx.config.model import ModelSettings

log = structlog.get_logger(__name__)

SAMPLE_RATE = 16_000  # what Whisper hears: mono float32 at 16 kHz
CT2_WEIGHTS = "model.bin"
_holder_lock = threading.Lock()


@dataclass
class LoadedSpeechModel:
    name: str
    model: Any  # mlx_whisper.whisper.Whisper
    directory: str
    multilingual: bool
    fp16: bool  # compute in float16 (Metal); float32 on the CPU, where it is faster
    load_seconds: float = 0.0
    languages: frozenset[str] = field(default_factory=frozenset)


@dataclass(frozen=True)
class SpeechOptions:
    """One request's decoding settings, already checked at the API boundary."""

    task: str = "transcribe"  # or "translate" (to English)
    language: str | None = None  # None: detected (multilingual) or English (.en models)
    prompt: str | None = None
    temperature: float | None = None  # None: mlx-whisper's fallback ladder 0.0 .. 1.0
    word_timestamps: bool = False


def speech_model_dir(model: ModelSettings, resolved: Path, cache_dir: Path) -> Path:
    """The mlx-whisper directory for a resolved source: a CTranslate2 folder (the bundled
    model) is imported into `cache_dir` on first use."""
    if (resolved / CT2_WEIGHTS).is_file():
        from vllm_mlx.models.whisper_import import import_ctranslate2_whisper

        return import_ctranslate2_whisper(resolved, cache_dir)
    if not any((resolved / f).is_file() for f in ("weights.safetensors", "weights.npz")):
        raise ValueError(
            f"model '{model.name}': {resolved} is not an mlx-whisper model (no "
            f"weights.safetensors or weights.npz) nor a CTranslate2 one ({CT2_WEIGHTS})"
        )
    return resolved


def load_speech_model(model: ModelSettings, model_dir: Path) -> LoadedSpeechModel:
    """A Whisper model in memory, its weights in the float width it computes in."""
    # Imported here, not at the top: importing mlx before the daemon picks its BLAS
    # (models/cpu/blas.py) would leave every model on MLX's slow reference BLAS.
    import mlx.core as mx
    from mlx.utils import tree_map
    from mlx_whisper.load_models import load_model
    from mlx_whisper.tokenizer import LANGUAGES

    from vllm_mlx.models.cpu.whisper_attention import route_encoder_attention

    started = time.monotonic()
    fp16 = mx.default_device() == mx.gpu
    dtype = mx.float16 if fp16 else mx.float32
    whisper = load_model(str(model_dir), dtype=dtype)

    def cast(value: Any) -> Any:
        floating = isinstance(value, mx.array) and mx.issubdtype(value.dtype, mx.floating)
        return value.astype(dtype) if floating else value

    whisper.update(tree_map(cast, whisper.parameters()))
    # Evaluated here, not lazily: a lazy array belongs to the stream of the thread that
    # built it (this loader thread), and the engine thread cannot evaluate it.
    mx.eval(whisper.parameters(), whisper.encoder._positional_embedding, whisper.decoder._mask)
    # On the CPU the encoder's softmax is most of a window's time: the extension's
    # threaded one takes it when built (models/cpu/whisper_attention.py).
    routed = not fp16 and route_encoder_attention(whisper)
    multilingual = bool(whisper.is_multilingual)
    languages = frozenset(LANGUAGES) if multilingual else frozenset({"en"})
    seconds = time.monotonic() - started
    log.info("model loaded", model=model.name, task="transcribe", directory=str(model_dir),
             multilingual=multilingual, encoder_kernel=routed,
             seconds=round(seconds, 2))  # fmt: skip
    return LoadedSpeechModel(
        model.name, whisper, str(model_dir), multilingual, fp16, seconds, languages
    )


def transcribe(loaded: LoadedSpeechModel, audio: Any, options: SpeechOptions) -> dict[str, Any]:
    """mlx-whisper's transcription of a mono 16 kHz float32 array (blocking: the model's
    engine thread). Returns its dict: text, segments (with words when asked), language."""
    import mlx_whisper
    from mlx_whisper.transcribe import ModelHolder

    kwargs: dict[str, Any] = {
        "task": options.task,
        "language": options.language,
        "initial_prompt": options.prompt,
        "word_timestamps": options.word_timestamps,
        "fp16": loaded.fp16,
        "verbose": None,  # no console output, no progress bar
    }
    if options.temperature is not None:
        kwargs["temperature"] = options.temperature
    with _holder_lock:
        ModelHolder.model, ModelHolder.model_path = loaded.model, loaded.directory
        result: dict[str, Any] = mlx_whisper.transcribe(
            audio, path_or_hf_repo=loaded.directory, **kwargs
        )
    return result
