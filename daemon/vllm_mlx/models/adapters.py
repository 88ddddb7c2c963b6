"""mlx-lm adapter directories: read, check against a base model, turn into LoRA pairs.

An adapter directory is what `mlx_lm.lora` writes: `adapter_config.json` (the
fine-tune type, `num_layers`, `lora_parameters` with `rank`, `scale` and optional
`keys`) and `adapters.safetensors` (`<module path>.lora_a` / `.lora_b`). The layers it
targets are chosen exactly as mlx-lm's `linear_to_lora_layers` chooses them, and its
tensors are checked as `load_adapters` checks them, so an adapter loads here exactly
when `mlx_lm.load(..., adapter_path=...)` would load it, with the same effect.

`check_adapter_dir` needs no model (check-config runs it on every config load);
`adapter_pairs` needs the loaded base (and mlx) and finds what only the base can tell (an adapter
made for another architecture or size).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # mlx is imported only once a model is loaded (after the BLAS choice)
    from vllm_mlx.models.lora import LoRAPair

CONFIG = "adapter_config.json"
WEIGHTS = "adapters.safetensors"
MAX_HEADER = 100 * 2**20


class AdapterError(ValueError):
    """An adapter that cannot be served (its message says why)."""


@dataclass(frozen=True)
class AdapterConfig:
    num_layers: int
    rank: int
    scale: float
    keys: tuple[str, ...] | None


def read_config(directory: Path) -> AdapterConfig:
    path = directory / CONFIG
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise AdapterError(f"{path} does not exist (not an mlx-lm adapter directory)") from exc
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise AdapterError(f"{path} is not readable JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise AdapterError(f"{path} is not a JSON object")
    kind = raw.get("fine_tune_type", "lora")
    if kind != "lora":
        raise AdapterError(
            f"{path}: fine_tune_type {kind!r} cannot be served beside the base weights "
            "(only `lora`; fuse a DoRA or full fine-tune with `mlx_lm.fuse` and serve it "
            "as its own model)"
        )
    params = raw.get("lora_parameters")
    if not isinstance(params, dict):
        raise AdapterError(f"{path} has no `lora_parameters` object")
    rank, scale, keys = params.get("rank"), params.get("scale"), params.get("keys")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise AdapterError(f"{path}: lora_parameters.rank must be a positive integer")
    if not isinstance(scale, int | float) or isinstance(scale, bool):
        raise AdapterError(f"{path}: lora_parameters.scale must be a number")
    if keys is not None and not (isinstance(keys, list) and all(isinstance(k, str) for k in keys)):
        raise AdapterError(f"{path}: lora_parameters.keys must be a list of module names")
    layers = raw.get("num_layers", 16)
    if not isinstance(layers, int) or isinstance(layers, bool):
        raise AdapterError(f"{path}: num_layers must be an integer")
    return AdapterConfig(layers, rank, float(scale), tuple(keys) if keys is not None else None)


def tensor_shapes(directory: Path) -> dict[str, tuple[int, ...]]:
    """The tensors of adapters.safetensors from its header (no data read)."""
    path = directory / WEIGHTS
    try:
        with path.open("rb") as handle:
            (size,) = struct.unpack("<Q", handle.read(8))
            if size > MAX_HEADER:
                raise AdapterError(f"{path} is not a safetensors file (header too large)")
            header = json.loads(handle.read(size))
    except FileNotFoundError as exc:
        raise AdapterError(f"{path} does not exist (not an mlx-lm adapter directory)") from exc
    except (OSError, struct.error, UnicodeDecodeError, ValueError) as exc:
        raise AdapterError(f"{path} is not a safetensors file: {exc}") from exc
    return {
        name: tuple(info["shape"])
        for name, info in header.items()
        if name != "__metadata__" and isinstance(info, dict)
    }


def check_adapter_dir(directory: Path) -> AdapterConfig:
    """The adapter's config when its files are a LoRA adapter whose tensors agree with its
    rank; AdapterError naming the file and the tensor otherwise."""
    if not directory.is_dir():
        raise AdapterError(f"adapter directory {str(directory)!r} does not exist")
    config = read_config(directory)
    shapes = tensor_shapes(directory)
    if not shapes:
        raise AdapterError(f"{directory / WEIGHTS} holds no tensors")
    for name, shape in shapes.items():
        leaf = name.rsplit(".", 1)[-1]
        if leaf not in ("lora_a", "lora_b"):
            raise AdapterError(f"{directory / WEIGHTS}: {name} is not a LoRA tensor")
        rank = shape[-1] if leaf == "lora_a" else shape[0]
        if len(shape) != 2 or rank != config.rank:
            raise AdapterError(
                f"{directory / WEIGHTS}: {name} has shape {shape}, not rank "
                f"{config.rank} as adapter_config.json says"
            )
    return config


def target_layers(model: Any, config: AdapterConfig) -> dict[str, Any]:
    """Full module path -> layer, for the layers mlx-lm's linear_to_lora_layers would
    wrap (the last `num_layers` blocks; every linear in a block unless `keys` names them)."""
    from vllm_mlx.models.lora import is_linear

    blocks = list(model.layers)
    keys = set(config.keys) if config.keys is not None else None
    if keys is None:
        keys = {name for block in blocks for name, module in block.named_modules() if name}
        keys = {k for k in keys if _lora_kind(_module_at(blocks, k))}
    wanted: set[int] = set()
    for block in blocks[-max(config.num_layers, 0) :]:
        for name, module in block.named_modules():
            if name in keys:
                if not is_linear(module):
                    raise AdapterError(
                        f"the adapter targets {name} ({type(module).__name__}); only "
                        "linear layers take an adapter here"
                    )
                wanted.add(id(module))
    return {path: m for path, m in model.named_modules() if id(m) in wanted}


def _module_at(blocks: list[Any], key: str) -> Any:
    for block in blocks:
        modules = dict(block.named_modules())
        if key in modules:
            return modules[key]
    return None


def _lora_kind(module: Any) -> bool:
    # The types linear_to_lora_layers gathers keys for (a non-linear one is refused above).
    from vllm_mlx.models.lora import is_linear

    if module is None:
        return False
    if is_linear(module) or hasattr(module, "to_lora"):
        return True
    from mlx.nn.layers.embedding import Embedding
    from mlx.nn.layers.quantized import QuantizedEmbedding

    return isinstance(module, Embedding | QuantizedEmbedding) or "Switch" in type(module).__name__


def layer_dims(module: Any) -> tuple[int, int]:
    """(input_dims, output_dims) of a linear layer, quantized or not."""
    output_dims, input_dims = module["weight"].shape
    if "scales" in module:
        input_dims = input_dims * 32 // module.bits
    return int(input_dims), int(output_dims)


def adapter_pairs(model: Any, directory: Path) -> dict[str, LoRAPair]:
    """The adapter's pairs by full module path, checked against `model` as mlx-lm's
    load_adapters checks them (AdapterError listing every mismatch)."""
    import mlx.core as mx

    from vllm_mlx.models.lora import LoRAPair

    config = check_adapter_dir(directory)
    targets = target_layers(model, config)
    weights = mx.load(str(directory / WEIGHTS))
    assert isinstance(weights, dict)
    errors = []
    for name, w in weights.items():
        path, leaf = name.rsplit(".", 1)
        module = targets.get(path)
        if module is None:
            errors.append(f"  {name}: not an adapter parameter in the model")
            continue
        inputs, outputs = layer_dims(module)
        want = (inputs, config.rank) if leaf == "lora_a" else (config.rank, outputs)
        if tuple(w.shape) != want:
            errors.append(
                f"  {name}: adapter shape {tuple(w.shape)} does not match "
                f"model parameter shape {want}"
            )
    if errors:
        raise AdapterError(
            f"adapter at {directory} does not fit this model:\n" + "\n".join(errors[:8])
        )
    pairs = {}
    for path in targets:
        a, b = weights.get(f"{path}.lora_a"), weights.get(f"{path}.lora_b")
        if b is None:
            continue  # mlx-lm's lora_b starts at zero: no update at this layer
        if a is None:
            raise AdapterError(f"adapter at {directory} has {path}.lora_b but no lora_a")
        pairs[path] = LoRAPair(a, b, config.scale)
    mx.eval([(p.a, p.b) for p in pairs.values()])
    return pairs
