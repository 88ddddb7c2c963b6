"""What Ollama clients ask about models: /api/tags, /api/show, /api/ps.

Models come from the config file, not from Ollama's registry, so a model's `digest` is a
stable hash of its name and source, `modified_at` is when the daemon registered it, and
its details (family, quantization, parameter count, size on disk) come from its files:
the same whether it is loaded or not, as Ollama reads them from the model's files (clients
size their context from /api/show before the first request). Reading them may hash or
import a GGUF file, so callers run these functions in a worker thread.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm_mlx.api.ollama import convert
from vllm_mlx.api.principal import visible
from vllm_mlx.api.state import ServerState
from vllm_mlx.config.model import ModelSettings
from vllm_mlx.engine.fleet.footprint import footprint
from vllm_mlx.engine.fleet.registry import ModelEntry
from vllm_mlx.models.estimate import local_model_dir
from vllm_mlx.models.loader import context_length_in
from vllm_mlx.models.plan import weight_info_from_files

NEVER = "2318-01-01T00:00:00Z"  # what Ollama shows for a model kept loaded for good


@dataclass(frozen=True)
class ModelFiles:
    """What a model's directory says about it; empty when its files are not here."""

    config: dict[str, Any] = field(default_factory=dict)
    parameters: int = 0
    disk_bytes: int = 0
    chat_template: str = ""


# Per (source, revision): a model's files do not change while it is served, and finding
# a GGUF model's import hashes the whole file. Models sharing a source share the entry.
_files: dict[tuple[str, str | None], ModelFiles] = {}
_files_lock = threading.Lock()


def _directory(state: ServerState, entry: ModelEntry) -> Path | None:
    runner = entry.engine if entry.engine is not None else entry.embedder
    if runner is not None:
        return Path(runner.loaded.directory)
    try:
        return local_model_dir(entry.settings, state.settings.resolved_cache_dir())
    except Exception:  # unreadable or not importable: listed without details
        return None


def _read(directory: Path) -> ModelFiles:
    try:
        config = json.loads((directory / "config.json").read_text())
        weights = sorted(directory.glob("*.safetensors"))
        disk = sum(f.stat().st_size for f in weights)
        parameters = weight_info_from_files(directory).float32_bytes // 4
    except (OSError, ValueError):
        return ModelFiles()
    config = config if isinstance(config, dict) else {}
    return ModelFiles(config, parameters, disk, _chat_template(directory))


def _chat_template(directory: Path) -> str:
    """Where transformers keeps it: its own file, else tokenizer_config.json."""
    try:
        return (directory / "chat_template.jinja").read_text()
    except OSError:
        pass
    try:
        tokenizer_config = json.loads((directory / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return ""
    template = tokenizer_config.get("chat_template") if isinstance(tokenizer_config, dict) else ""
    return template if isinstance(template, str) else ""  # a list of named ones: none shown


def model_files(state: ServerState, entry: ModelEntry) -> ModelFiles:
    key = (entry.settings.source, entry.settings.revision)
    with _files_lock:
        known = _files.get(key)
    if known is not None:
        return known
    directory = _directory(state, entry)
    found = _read(directory) if directory is not None else ModelFiles()
    if found.config:  # a hub model not downloaded yet may be, later
        with _files_lock:
            _files[key] = found
    return found


def _format(settings: ModelSettings) -> str:
    source = settings.source
    if source.endswith(".gguf") or source == "builtin:smollm2-135m-instruct":
        return "gguf"
    return "safetensors"


def _parameter_size(count: float) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if count >= scale:
            return f"{count / scale:.1f}{unit}"
    return str(int(count))


def details(entry: ModelEntry, files: ModelFiles) -> dict[str, Any]:
    config = files.config
    family = str(config.get("model_type", "bert" if entry.settings.task == "embed" else ""))
    quantization = config.get("quantization")
    bits = quantization.get("bits") if isinstance(quantization, dict) else None
    level = f"Q{bits}" if bits else str(config.get("torch_dtype", "")).upper().replace("FLOAT", "F")
    return {
        "parent_model": "",
        "format": _format(entry.settings),
        "family": family,
        "families": [family] if family else None,
        "parameter_size": _parameter_size(files.parameters) if files.parameters else "",
        "quantization_level": level,
    }


def _names(state: ServerState, entry: ModelEntry) -> list[str]:
    name = entry.settings.name
    return [name, *state.registry.aliases_of(name), *state.registry.adapter_ids_of(name)]


def _summary(entry: ModelEntry, model_id: str, files: ModelFiles) -> dict[str, Any]:
    listed = convert.listed_name(model_id)
    return {
        "name": listed,
        "model": listed,
        "modified_at": convert.timestamp(entry.created),
        "size": files.disk_bytes,  # as Ollama: the model's files, not its memory
        "digest": convert.digest(f"{entry.settings.name}\0{entry.settings.source}"),
        "details": details(entry, files),
    }


def tags(state: ServerState) -> dict[str, Any]:
    """Every configured model and alias (loaded or not)."""
    return {
        "models": [
            _summary(entry, model_id, model_files(state, entry))
            for entry in visible(state.registry.entries())
            for model_id in _names(state, entry)
        ]
    }


def _expires_at(state: ServerState, entry: ModelEntry) -> str:
    manager = state.residency
    model = manager.model_settings(entry) if manager else entry.settings
    keep_alive = manager.keep_alive(entry) if manager else model.keep_alive
    if keep_alive < 0:
        return NEVER
    idle = manager.idle_seconds(entry) if manager else None
    left = keep_alive - (idle or 0.0)
    return convert.timestamp(time.time() + max(0.0, left))


def ps(state: ServerState) -> dict[str, Any]:
    """The models in memory now, with when keep_alive lets them go."""
    models = []
    for entry in visible(state.registry.entries()):
        if entry.runner is None:
            continue
        summary = _summary(entry, entry.settings.name, model_files(state, entry))
        context = entry.engine.context_length if entry.engine is not None else None
        models.append(
            {
                **summary,
                "size": footprint(entry).total,
                "size_vram": 0,  # unified memory or the CPU: nothing is on a separate card
                "expires_at": _expires_at(state, entry),
                **({"context_length": context} if context else {}),
            }
        )
    return {"models": models}


def _context_length(entry: ModelEntry, files: ModelFiles) -> int | None:
    if entry.engine is not None:
        return entry.engine.context_length
    if entry.settings.context_length is not None:
        return entry.settings.context_length
    return context_length_in(files.config) if files.config else None


def capabilities(model: ModelSettings) -> list[str]:
    if model.task == "embed":
        return ["embedding"]
    if model.task == "rerank":
        return ["rerank"]
    if model.task == "transcribe":
        return ["transcription"]
    found = ["completion"]
    if model.enable_auto_tool_choice and model.tool_call_parser is not None:
        found.append("tools")
    if model.reasoning_parser is not None:
        found.append("thinking")
    return found


def show(state: ServerState, entry: ModelEntry) -> dict[str, Any]:
    model = state.residency.model_settings(entry) if state.residency else entry.settings
    files = model_files(state, entry)
    info = details(entry, files)
    arch = info["family"] or "unknown"
    model_info: dict[str, Any] = {"general.architecture": arch}
    context = _context_length(entry, files)
    if context:
        model_info[f"{arch}.context_length"] = context
    template = files.chat_template
    if entry.engine is not None:  # what it renders with, a configured override included
        template = str(getattr(entry.engine.tokenizer, "chat_template", "") or "")
    d = state.settings.defaults  # what a request that sets no option samples with
    parameters = f"temperature {d.temperature}\ntop_p {d.top_p}\ntop_k {d.top_k}"
    return {
        "modelfile": f"# Served by vllm-mlx from its config file\nFROM {model.source}\n",
        "parameters": parameters,
        "template": template,
        "details": info,
        "model_info": model_info,
        "capabilities": capabilities(model),
        "modified_at": convert.timestamp(entry.created),
    }
