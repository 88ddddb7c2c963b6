"""How much memory a model will take, estimated from its files before it is loaded.

Used by check-config (a budget smaller than the smallest model is an error) and by the
budget check before a load (engine/fleet/residency.py), which replaces the estimate with the
measured size once the model is in memory.
"""

from __future__ import annotations

from pathlib import Path

from vllm_mlx.config.model import ModelSettings
from vllm_mlx.config.settings import Settings
from vllm_mlx.models.rerank import rerank_method_of
from vllm_mlx.models.sources import SourceKind, classify_source

FLOAT_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def estimated_bytes(model: ModelSettings, cache_dir: Path) -> int | None:
    """The weights' size as they will be served; None when the files are not here
    (a hub model not downloaded yet)."""
    directory = local_model_dir(model, cache_dir)
    if directory is None or not (directory / "config.json").is_file():
        return None
    on_disk = sum(f.stat().st_size for f in directory.glob("*.safetensors"))
    if model.task == "transcribe":
        # Whisper: float16 files (CTranslate2's model.bin, or weights.*) served as float32
        # on the CPU; counted at that width, the larger.
        stored = [*directory.glob("weights.*"), *directory.glob("model.bin")]
        return 2 * sum(f.stat().st_size for f in stored)
    if model.task == "embed" or (
        model.task == "rerank" and rerank_method_of(directory, model.rerank_method) != "llm"
    ):
        return on_disk  # BERTs are served in the stored format
    from vllm_mlx.models.cpu import blas
    from vllm_mlx.models.plan import planned, weight_info_from_files

    choice = blas.active()
    decision = planned(model, directory, blas_optimized=choice is not None and choice.optimized)
    if decision.chosen in FLOAT_BYTES:
        # A quantized model served as floats: its element count at that width.
        return weight_info_from_files(directory).float32_bytes * FLOAT_BYTES[decision.chosen] // 4
    return on_disk


def local_model_dir(model: ModelSettings, cache_dir: Path) -> Path | None:
    """The model's directory if its files are on this machine (never downloads)."""
    from vllm_mlx.models.loader import cached_hub_dir, resolve_model_dir

    kind = classify_source(model.source).kind
    if kind is SourceKind.HF_REPO:
        return cached_hub_dir(model)
    return resolve_model_dir(model, cache_dir)  # local work: a GGUF import at most


def budget_problem(settings: Settings) -> str | None:
    """check-config's complaint when the budget cannot hold even the smallest model."""
    import psutil

    budget = settings.memory.budget_bytes(psutil.virtual_memory().total)
    if budget is None:
        return None
    cache_dir = settings.resolved_cache_dir()
    sizes = {
        m.name: size for m in settings.models if (size := estimated_bytes(m, cache_dir)) is not None
    }
    if not sizes:
        return None
    name = min(sizes, key=lambda n: sizes[n])
    if sizes[name] <= budget:
        return None
    return (
        f"the memory budget ({budget / 2**20:.0f} MiB) is smaller than the smallest model, "
        f"{name!r} ({sizes[name] / 2**20:.0f} MiB of weights as served): no model could load"
    )
