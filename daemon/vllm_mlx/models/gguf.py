"""Import a llama-architecture GGUF file as an mlx-lm model directory.

MLX reads GGUF natively: ``mx.load(path, return_metadata=True)`` returns Q4_0/Q4_1/Q8_0
tensors already as MLX affine-quantized weight/scales/biases (group size 32) plus the
metadata. What is left to do is renaming tensors to mlx-lm's Hugging Face names, undoing
llama.cpp's RoPE row permutation of attn_q/attn_k, writing a config with a per-module
quantization block, and rebuilding the tokenizer (see ``gguf_tokenizer``). Nothing is
requantized, so the imported model computes exactly what the GGUF holds.

The result is cached under ``cache_root/gguf/<sha256[:16]>`` and is written to a temp dir
beside it and renamed into place, so a crash never leaves a half-written model. The hash
itself is remembered under ``cache_root/gguf-digests`` while the file is unchanged, so a
restart does not read the whole GGUF again.
"""

from __future__ import annotations

import collections
import json
import os
import pathlib
import shutil
import tempfile
import time
from collections.abc import Mapping
from typing import Any

import mlx.core as mx
import numpy as np
import structlog

from vllm_mlx.models.file_digest import content_digest
from vllm_mlx.models.gguf_header import BLOCK_NAMES, GLOBAL_NAMES, TENSOR_RE
from vllm_mlx.models.gguf_tokenizer import TokenizerFacts, write_tokenizer_files

log = structlog.get_logger(__name__)

# Every file a finished import holds; a directory missing any of them is not a cache hit.
_REQUIRED_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
)
_DIGEST_CHARS = 16
# Beside `gguf/`: each GGUF path's hash, remembered by its stat (models/file_digest.py).
DIGEST_MEMO_DIR = "gguf-digests"
# GGUF's quantized block types (Q4_0, Q4_1, Q8_0) all use 32-weight blocks.
_GGUF_GROUP_SIZE = 32


class GGUFImportError(ValueError):
    """The GGUF file holds a model this importer cannot convert."""


def import_gguf(gguf_path: pathlib.Path, cache_root: pathlib.Path) -> pathlib.Path:
    """Convert ``gguf_path`` once into an mlx-lm model directory and return that directory.

    A second call with the same file content returns the existing directory untouched.
    """
    digest = content_digest(gguf_path, cache_root / DIGEST_MEMO_DIR)[:_DIGEST_CHARS]
    parent = cache_root / "gguf"
    target = parent / digest
    if _is_complete(target):
        log.debug("gguf_import_cache_hit", path=str(gguf_path), model_dir=str(target))
        return target

    parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    staging = pathlib.Path(tempfile.mkdtemp(prefix=f".{digest}.", dir=parent))
    try:
        _convert(gguf_path, staging)
        # mkdtemp makes the dir private (0700); the published model is ordinary data.
        staging.chmod(0o755)
        _fsync_files(staging)
        _publish(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log.info(
        "gguf_imported",
        path=str(gguf_path),
        model_dir=str(target),
        seconds=round(time.perf_counter() - started, 2),
    )
    return target


def _is_complete(model_dir: pathlib.Path) -> bool:
    return all((model_dir / name).is_file() for name in _REQUIRED_FILES)


def _fsync_files(directory: pathlib.Path) -> None:
    # Without this a power loss soon after the rename could leave the published name
    # pointing at files whose data never reached the disk.
    for path in directory.iterdir():
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _publish(staging: pathlib.Path, target: pathlib.Path) -> None:
    """Move ``staging`` to ``target`` atomically, tolerating a concurrent importer."""
    if target.exists() and not _is_complete(target):
        # Left by something other than this importer (which only renames finished
        # directories): move it aside first, since rename cannot replace a non-empty dir.
        doomed = pathlib.Path(tempfile.mkdtemp(prefix=f".{target.name}.stale.", dir=target.parent))
        os.replace(target, doomed / "old")
        shutil.rmtree(doomed, ignore_errors=True)
    try:
        os.rename(staging, target)
    except OSError:
        # Another process published the same digest first; its copy is identical.
        if not _is_complete(target):
            raise


def _convert(gguf_path: pathlib.Path, out_dir: pathlib.Path) -> None:
    loaded = mx.load(str(gguf_path), return_metadata=True)
    assert isinstance(loaded, tuple)  # return_metadata=True always yields a pair
    tensors, metadata = loaded
    arch = metadata.get("general.architecture")
    if arch != "llama":
        raise GGUFImportError(f"unsupported GGUF architecture {arch!r} (only llama)")

    config = _model_config(metadata, tensors)
    weights = _hf_weights(tensors, config)
    if quantization := _quantization_block(weights):
        config["quantization"] = quantization
    facts = write_tokenizer_files(metadata, out_dir)
    config.update(_token_ids(facts))

    mx.save_safetensors(str(out_dir / "model.safetensors"), weights, metadata={"format": "mlx"})
    _write_json(out_dir / "config.json", config)
    _write_json(out_dir / "generation_config.json", _token_ids(facts))


def _model_config(metadata: Mapping[str, Any], tensors: Mapping[str, mx.array]) -> dict[str, Any]:
    def num(key: str) -> float:
        value = metadata.get(f"llama.{key}")
        if value is None:
            raise GGUFImportError(f"GGUF metadata lacks llama.{key}")
        return float(value.item())

    def opt_num(key: str, default: float) -> float:
        value = metadata.get(f"llama.{key}")
        return default if value is None else float(value.item())

    hidden = int(num("embedding_length"))
    heads = int(num("attention.head_count"))
    if "llama.rope.scaling.type" in metadata:
        raise GGUFImportError("GGUF rope scaling is not supported yet")
    if "rope_freqs.weight" in tensors:
        raise GGUFImportError("GGUF rope_freqs (Llama 3.1 rope) is not supported yet")
    embed = tensors["token_embd.weight"]
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": int(num("feed_forward_length")),
        "num_hidden_layers": int(num("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(opt_num("attention.head_count_kv", heads)),
        "head_dim": int(opt_num("attention.key_length", hidden // heads)),
        "rms_norm_eps": num("attention.layer_norm_rms_epsilon"),
        "rope_theta": opt_num("rope.freq_base", 10000.0),
        "vocab_size": int(opt_num("vocab_size", embed.shape[0])),
        "max_position_embeddings": int(num("context_length")),
        # llama.cpp's converter drops output.weight when the head shares the embedding.
        "tie_word_embeddings": "output.weight" not in tensors,
        "attention_bias": False,
        "mlp_bias": False,
    }


def _hf_weights(tensors: Mapping[str, mx.array], config: Mapping[str, Any]) -> dict[str, mx.array]:
    heads = {
        "attn_q": int(config["num_attention_heads"]),
        "attn_k": int(config["num_key_value_heads"]),
    }
    out: dict[str, mx.array] = {}
    for name, tensor in tensors.items():
        match = TENSOR_RE.match(name)
        if match is None:
            raise GGUFImportError(f"unexpected GGUF tensor {name!r}")
        block, base, part = match.groups()
        table = GLOBAL_NAMES if block is None else BLOCK_NAMES
        if base not in table:
            raise GGUFImportError(f"unexpected GGUF tensor {name!r}")
        prefix = table[base] if block is None else f"model.layers.{block}.{table[base]}"
        value = tensor
        if base in heads:
            value = _unpermute_rows(value, heads[base])
        if part != "weight" or value.ndim == 1:
            # Scales, biases and norms are small; float32 keeps MLX's CPU quantized
            # matmul on its fast path (float16 scales run it 25-40x slower there).
            value = value.astype(mx.float32)
        out[f"{prefix}.{part}"] = value
    return out


def _unpermute_rows(tensor: mx.array, n_head: int) -> mx.array:
    """Undo llama.cpp's RoPE permutation of a q/k projection's output rows.

    llama.cpp interleaves each head's two rotary halves (row ``h*D + 2*i + s`` holds HF
    row ``h*D + s*D/2 + i``) so its RoPE rotates adjacent pairs. Quantization groups run
    along columns, so the packed weight, scales and biases all permute by whole rows.
    """
    rows = tensor.shape[0]
    head_dim = rows // n_head
    if n_head * head_dim != rows or head_dim % 2:
        raise GGUFImportError(f"cannot split {rows} rows into {n_head} rotary heads")
    order = np.arange(rows).reshape(n_head, head_dim // 2, 2).swapaxes(1, 2).reshape(-1)
    return mx.take(tensor, mx.array(order), axis=0)


def _quantization_block(weights: Mapping[str, mx.array]) -> dict[str, Any]:
    """Describe each quantized module, with the most common setting as the default.

    GGUF files mix types (this one: Q8_0 embedding, Q4_1 linears); mlx-lm takes a
    per-module override keyed by module path inside ``config["quantization"]``.
    """
    per_module: dict[str, tuple[int, int]] = {}
    for key, scales in weights.items():
        if not key.endswith(".scales"):
            continue
        module = key.removesuffix(".scales")
        packed = weights[f"{module}.weight"]
        in_features = scales.shape[-1] * _GGUF_GROUP_SIZE
        per_module[module] = (packed.shape[-1] * 32 // in_features, _GGUF_GROUP_SIZE)
    if not per_module:
        return {}
    counts = collections.Counter(per_module.values())
    bits, group_size = counts.most_common(1)[0][0]
    block: dict[str, Any] = {"group_size": group_size, "bits": bits, "mode": "affine"}
    for module, (m_bits, m_group) in sorted(per_module.items()):
        if (m_bits, m_group) != (bits, group_size):
            block[module] = {"group_size": m_group, "bits": m_bits, "mode": "affine"}
    return block


def _token_ids(facts: TokenizerFacts) -> dict[str, Any]:
    ids: dict[str, Any] = {"eos_token_id": list(facts.eos_token_ids)}
    if facts.bos_token_id is not None:
        ids["bos_token_id"] = facts.bos_token_id
    if facts.pad_token_id is not None:
        ids["pad_token_id"] = facts.pad_token_id
    return ids


def _write_json(path: pathlib.Path, payload: Mapping[str, Any]) -> None:
    path.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")
