"""check-config's test of each adapter against its base model's shape, before any load.

An adapter made for another architecture or size passes every check of its own files
(config/adapters.py) and would fail only at its first request (a 503). When the base
model's config.json is on this machine (a local directory, a bundled or imported GGUF,
a hub model already downloaded), the adapter's tensor shapes are compared with the
sizes the base declares: the layer indices it names, and the input and output width of
each standard projection it adapts. A hub model not downloaded yet is checked when it
loads (models/adapters.py compares against the loaded weights).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from vllm_mlx.config.errors import KeyPath
from vllm_mlx.config.settings import Settings
from vllm_mlx.models.adapters import AdapterError, tensor_shapes
from vllm_mlx.models.estimate import local_model_dir

_LAYER = re.compile(r"\.layers\.(\d+)\.")


def adapter_fit_problems(settings: Settings) -> Iterator[tuple[KeyPath, str]]:
    """(key path, message) for each adapter whose tensors do not fit its base model."""
    cache_dir = settings.resolved_cache_dir()
    for index, model in enumerate(settings.models):
        if not model.adapters:
            continue
        directory = local_model_dir(model, cache_dir)
        if directory is None or not (directory / "config.json").is_file():
            continue
        base = _text_config(json.loads((directory / "config.json").read_text(encoding="utf-8")))
        for number, adapter in enumerate(model.adapters):
            try:
                shapes = tensor_shapes(adapter.path)
            except AdapterError as exc:  # reported by the field's own check already
                yield ("models", index, "adapters", number, "path"), str(exc)
                continue
            problem = mismatch(base, shapes)
            if problem is not None:
                message = (
                    f"the adapter in {str(adapter.path)!r} was not made for {model.source!r}: "
                    f"{problem}"
                )
                yield ("models", index, "adapters", number, "path"), message


def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    """A vision-language model's language half declares the sizes."""
    text = config.get("text_config")
    return text if isinstance(text, dict) and "hidden_size" not in config else config


def _expected(base: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """(input, output) width of each standard projection of a decoder block."""
    hidden = int(base.get("hidden_size", 0))
    heads = int(base.get("num_attention_heads", 0))
    if not hidden or not heads:
        return {}
    kv_heads = int(base.get("num_key_value_heads") or heads)
    head_dim = int(base.get("head_dim") or hidden // heads)
    widths = {
        "q_proj": (hidden, heads * head_dim),
        "k_proj": (hidden, kv_heads * head_dim),
        "v_proj": (hidden, kv_heads * head_dim),
        "o_proj": (heads * head_dim, hidden),
    }
    inter = int(base.get("intermediate_size") or 0)
    if inter:
        widths |= {"gate_proj": (hidden, inter), "up_proj": (hidden, inter)}
        widths["down_proj"] = (inter, hidden)
    return widths


def mismatch(base: dict[str, Any], shapes: dict[str, tuple[int, ...]]) -> str | None:
    """Why these adapter tensors cannot belong to a model of this config, or None."""
    layers = int(base.get("num_hidden_layers", 0))
    widths = _expected(base)
    for name, shape in sorted(shapes.items()):
        found = _LAYER.search(f".{name}")
        if layers and found and int(found.group(1)) >= layers:
            return f"{name} adapts layer {found.group(1)}; the base has {layers} layers"
        module, leaf = name.rsplit(".", 1) if "." in name else ("", name)
        want = widths.get(module.rsplit(".", 1)[-1])
        if want is None or len(shape) != 2:
            continue
        if leaf == "lora_a" and shape[0] != want[0]:
            return f"{name} takes inputs of width {shape[0]}; the base's is {want[0]}"
        if leaf == "lora_b" and shape[1] != want[1]:
            return f"{name} gives outputs of width {shape[1]}; the base's is {want[1]}"
    return None
