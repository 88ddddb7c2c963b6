"""What Ollama clients ask about models: /api/tags, /api/show, /api/ps.

Models come from the config file, not from Ollama's registry, so a model's `digest` is a
stable hash of its name and source, `modified_at` is when the daemon registered it, and
its details (family, quantization, parameter count) come from the loaded model's
config.json: a model that has not loaded yet lists what its source says.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from vllm_mlx.api.ollama import convert
from vllm_mlx.api.state import ServerState
from vllm_mlx.config.model import ModelSettings
from vllm_mlx.engine.fleet.footprint import footprint
from vllm_mlx.engine.fleet.registry import ModelEntry

NEVER = "2318-01-01T00:00:00Z"  # what Ollama shows for a model kept loaded for good


def _config(entry: ModelEntry) -> dict[str, Any]:
    loaded = entry.engine.loaded if entry.engine is not None else None
    if loaded is None:
        return {}
    try:
        value = json.loads((Path(loaded.directory) / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


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


def details(entry: ModelEntry) -> dict[str, Any]:
    config = _config(entry)
    family = str(config.get("model_type", "bert" if entry.settings.task == "embed" else ""))
    quantization = config.get("quantization")
    bits = quantization.get("bits") if isinstance(quantization, dict) else None
    level = f"Q{bits}" if bits else str(config.get("torch_dtype", "")).upper().replace("FLOAT", "F")
    size = ""
    if entry.weights_bytes and bits:
        # Affine quantization stores a scale and a bias (16 bits each) per group.
        group = quantization.get("group_size", 64) if isinstance(quantization, dict) else 64
        size = _parameter_size(entry.weights_bytes * 8 / (bits + 32 / group))
    elif entry.weights_bytes:
        size = _parameter_size(entry.weights_bytes / 4)
    return {
        "parent_model": "",
        "format": _format(entry.settings),
        "family": family,
        "families": [family] if family else None,
        "parameter_size": size,
        "quantization_level": level,
    }


def _names(state: ServerState, entry: ModelEntry) -> list[str]:
    name = entry.settings.name
    return [name, *state.registry.aliases_of(name)]


def _summary(entry: ModelEntry, model_id: str) -> dict[str, Any]:
    listed = convert.listed_name(model_id)
    return {
        "name": listed,
        "model": listed,
        "modified_at": convert.timestamp(entry.created),
        "size": footprint(entry).weights or entry.weights_bytes,
        "digest": convert.digest(f"{entry.settings.name}\0{entry.settings.source}"),
        "details": details(entry),
    }


def tags(state: ServerState) -> dict[str, Any]:
    """Every configured model and alias (loaded or not)."""
    return {
        "models": [
            _summary(entry, model_id)
            for entry in state.registry.entries()
            for model_id in _names(state, entry)
        ]
    }


def _expires_at(state: ServerState, entry: ModelEntry) -> str:
    manager = state.residency
    model = manager.model_settings(entry) if manager else entry.settings
    if model.keep_alive < 0 or model.pin:
        return NEVER
    idle = manager.idle_seconds(entry) if manager else None
    left = model.keep_alive - (idle or 0.0)
    return convert.timestamp(time.time() + max(0.0, left))


def ps(state: ServerState) -> dict[str, Any]:
    """The models in memory now, with when keep_alive lets them go."""
    models = []
    for entry in state.registry.entries():
        if entry.runner is None:
            continue
        summary = _summary(entry, entry.settings.name)
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


def capabilities(model: ModelSettings) -> list[str]:
    if model.task == "embed":
        return ["embedding"]
    found = ["completion"]
    if model.enable_auto_tool_choice and model.tool_call_parser is not None:
        found.append("tools")
    if model.reasoning_parser is not None:
        found.append("thinking")
    return found


def show(state: ServerState, entry: ModelEntry) -> dict[str, Any]:
    model = state.residency.model_settings(entry) if state.residency else entry.settings
    info = details(entry)
    arch = info["family"] or "unknown"
    model_info: dict[str, Any] = {"general.architecture": arch}
    if entry.engine is not None:
        model_info[f"{arch}.context_length"] = entry.engine.context_length
    template = ""
    if entry.engine is not None:
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
