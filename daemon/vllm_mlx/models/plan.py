"""Which path a model will compute on, read from its files without loading weights.

`vllm-mlx models` shows it, so an operator can see before starting the daemon whether a
quantized model will run in the CPU kernel, as float32 through BLAS, or as stored. The
same policy as at load time (`dtype.decide`); the weight sizes come from the safetensors
headers instead of the arrays.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from vllm_mlx.config.model import ModelSettings
from vllm_mlx.models.cpu.qmm import BITS, GROUP_SIZES, status
from vllm_mlx.models.dtype import (
    DtypeDecision,
    WeightInfo,
    backend,
    decide,
    int8_tiles,
    with_int8,
)

_FLOAT_TYPES = {"F32", "F16", "BF16", "F64"}


def planned(model: ModelSettings, directory: Path, *, blas_optimized: bool) -> DtypeDecision:
    import psutil

    device = backend()
    decision = decide(
        model.dtype,
        weight_info_from_files(directory),
        device=device,
        blas_optimized=blas_optimized,
        available_bytes=psutil.virtual_memory().available,
        kernel=status() if device == "cpu" else None,
    )
    tiles = int8_tiles() if decision.kernel else None
    return with_int8(decision, model.int8_activations, tiles)


def weight_info_from_files(directory: Path) -> WeightInfo:
    config = json.loads((directory / "config.json").read_text())
    quant = config.get("quantization") or config.get("quantization_config") or {}
    tensors: dict[str, tuple[str, int]] = {}
    for file in sorted(directory.glob("*.safetensors")):
        tensors.update(_header(file))
    elements = 0
    ready = bool(quant)
    for name, (dtype, size) in tensors.items():
        prefix, _, leaf = name.rpartition(".")
        if f"{prefix}.scales" in tensors:
            layer = quant.get(prefix, quant) if isinstance(quant.get(prefix), dict) else quant
            bits = int(layer.get("bits", 4))
            ready = ready and bits in BITS and layer.get("group_size") in GROUP_SIZES
            ready = ready and layer.get("mode", "affine") == "affine"
            if leaf == "weight":
                elements += size * 32 // bits
            elif leaf not in ("scales", "biases"):
                elements += size
        elif dtype in _FLOAT_TYPES:
            elements += size
    return WeightInfo(bool(quant), elements * 4, ready)


def _header(file: Path) -> dict[str, tuple[str, int]]:
    """Tensor name -> (dtype, element count), from the file's JSON header only.

    A file that is not a readable safetensors file counts as empty: the listing still
    shows the model, and loading it reports the real error.
    """
    try:
        with file.open("rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header: dict[str, Any] = json.loads(f.read(length))
    except (OSError, struct.error, ValueError):
        return {}
    if not isinstance(header, dict):
        return {}
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        count = 1
        for dim in meta["shape"]:
            count *= int(dim)
        out[name] = (str(meta["dtype"]), count)
    return out
