"""Import a CTranslate2 Whisper model (faster-whisper's format) into mlx-whisper's.

CTranslate2's `model.bin` is one little-endian file: a binary version, the spec's name
and revision, then every variable as (name, rank, dims, dtype id, byte count, raw bytes),
then aliases (name -> variable). Whisper's attention projections are stored fused
(self-attention q|k|v, cross-attention k|v, with a zero key bias Whisper does not have);
mlx-whisper keeps them apart, and its Conv1d weights are (out, kernel, in) where
CTranslate2 stores (out, in, kernel). Nothing else changes: the weights are copied in
the stored float16, so the import computes what the CTranslate2 model holds.

The result (`weights.safetensors` + mlx-whisper's `config.json`) is cached under
`cache_root/whisper/<sha256[:16]>`, written to a temporary directory beside it and
renamed into place, so a crash never leaves a half-written model. model.bin's hash is
remembered under `cache_root/whisper-digests` while the file is unchanged.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import tempfile
import time
from pathlib import Path

import mlx.core as mx
import numpy as np
import structlog

from vllm_mlx.models.file_digest import content_digest

log = structlog.get_logger(__name__)

_DTYPES = (np.float32, np.int8, np.int16, np.int32, np.float16)  # CTranslate2's ids 0-4
_REQUIRED = ("config.json", "weights.safetensors")
_DIGEST_CHARS = 16
# Beside `whisper/`: model.bin's hash, remembered by its stat (models/file_digest.py).
DIGEST_MEMO_DIR = "whisper-digests"


class WhisperImportError(ValueError):
    """The file is not a CTranslate2 Whisper model this importer can convert."""


def read_ctranslate2(path: Path) -> tuple[str, dict[str, np.ndarray]]:
    """The spec name and every variable of a CTranslate2 `model.bin` (aliases resolved)."""
    data = path.read_bytes()
    offset = 0

    def take(fmt: str) -> int:
        nonlocal offset
        (value,) = struct.unpack_from("<" + fmt, data, offset)
        offset += struct.calcsize(fmt)
        return int(value)

    def text() -> str:
        nonlocal offset
        length = take("H")
        value = data[offset : offset + length - 1].decode("utf-8")  # NUL-terminated
        offset += length
        return value

    try:
        version = take("I")
        if not 2 <= version <= 6:
            raise WhisperImportError(f"{path}: CTranslate2 binary version {version} is unknown")
        spec, _revision = text(), take("I")
        variables: dict[str, np.ndarray] = {}
        for _ in range(take("I")):
            name = text()
            shape = [take("I") for _ in range(take("B"))]
            type_id = take("B") if version >= 4 else 0
            if type_id >= len(_DTYPES):
                raise WhisperImportError(f"{path}: {name} has dtype id {type_id}")
            size, dtype = take("I"), np.dtype(_DTYPES[type_id])
            if offset + size > len(data):
                raise struct.error("a variable runs past the end of the file")
            raw = np.frombuffer(data, dtype, size // dtype.itemsize, offset)
            variables[name] = raw.reshape(shape) if shape else raw.reshape(())
            offset += size
        for _ in range(take("I")):
            alias, target = text(), text()
            variables[alias] = variables[target]
    except struct.error as exc:
        raise WhisperImportError(f"{path} is truncated or not a CTranslate2 model") from exc
    return spec, variables


def _split(weight: np.ndarray, parts: int) -> list[np.ndarray]:
    return list(np.split(weight, parts, axis=0))


def _attention(
    out: dict[str, np.ndarray], v: dict[str, np.ndarray], src: str, dst: str, cross: bool
) -> None:
    """A CTranslate2 attention block's fused projections as mlx-whisper's four Linears."""
    if cross:
        out[f"{dst}.query.weight"] = v[f"{src}/linear_0/weight"]
        out[f"{dst}.query.bias"] = v[f"{src}/linear_0/bias"]
        key, value = _split(v[f"{src}/linear_1/weight"], 2)
        _, value_bias = _split(v[f"{src}/linear_1/bias"], 2)
        projection = f"{src}/linear_2"
    else:
        query, key, value = _split(v[f"{src}/linear_0/weight"], 3)
        query_bias, _, value_bias = _split(v[f"{src}/linear_0/bias"], 3)
        out[f"{dst}.query.weight"], out[f"{dst}.query.bias"] = query, query_bias
        projection = f"{src}/linear_1"
    out[f"{dst}.key.weight"] = key  # Whisper's key has no bias (CTranslate2 stores zeros)
    out[f"{dst}.value.weight"], out[f"{dst}.value.bias"] = value, value_bias
    out[f"{dst}.out.weight"] = v[f"{projection}/weight"]
    out[f"{dst}.out.bias"] = v[f"{projection}/bias"]


def _norm(out: dict[str, np.ndarray], v: dict[str, np.ndarray], src: str, dst: str) -> None:
    out[f"{dst}.weight"], out[f"{dst}.bias"] = v[f"{src}/gamma"], v[f"{src}/beta"]


def _block(
    out: dict[str, np.ndarray], v: dict[str, np.ndarray], src: str, dst: str, cross: bool
) -> None:
    _norm(out, v, f"{src}/self_attention/layer_norm", f"{dst}.attn_ln")
    _attention(out, v, f"{src}/self_attention", f"{dst}.attn", cross=False)
    if cross:
        _norm(out, v, f"{src}/attention/layer_norm", f"{dst}.cross_attn_ln")
        _attention(out, v, f"{src}/attention", f"{dst}.cross_attn", cross=True)
    _norm(out, v, f"{src}/ffn/layer_norm", f"{dst}.mlp_ln")
    for index, name in ((0, "mlp1"), (1, "mlp2")):
        out[f"{dst}.{name}.weight"] = v[f"{src}/ffn/linear_{index}/weight"]
        out[f"{dst}.{name}.bias"] = v[f"{src}/ffn/linear_{index}/bias"]


def _layers(v: dict[str, np.ndarray], side: str) -> int:
    parts = (name.split("/") for name in v if name.startswith(f"{side}/layer_"))
    return len({p[1] for p in parts if p[1][len("layer_") :].isdigit()})


def mlx_whisper_weights(
    v: dict[str, np.ndarray], alignment_heads: list[list[int]]
) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """mlx-whisper's parameter names and its ModelDimensions, from CTranslate2's variables."""
    out: dict[str, np.ndarray] = {}
    for conv in ("conv1", "conv2"):
        out[f"encoder.{conv}.weight"] = v[f"encoder/{conv}/weight"].transpose(0, 2, 1)
        out[f"encoder.{conv}.bias"] = v[f"encoder/{conv}/bias"]
    encoder_layers, decoder_layers = _layers(v, "encoder"), _layers(v, "decoder")
    for i in range(encoder_layers):
        _block(out, v, f"encoder/layer_{i}", f"encoder.blocks.{i}", cross=False)
    _norm(out, v, "encoder/layer_norm", "encoder.ln_post")
    out["decoder.token_embedding.weight"] = v["decoder/embeddings/weight"]
    out["decoder.positional_embedding"] = v["decoder/position_encodings/encodings"]
    for i in range(decoder_layers):
        _block(out, v, f"decoder/layer_{i}", f"decoder.blocks.{i}", cross=True)
    _norm(out, v, "decoder/layer_norm", "decoder.ln")
    if alignment_heads:
        out["alignment_heads"] = np.asarray(alignment_heads, dtype=np.int64)
    vocab, text_state = v["decoder/embeddings/weight"].shape
    dims = {
        "n_mels": int(v["encoder/conv1/weight"].shape[1]),
        "n_audio_ctx": int(v["encoder/position_encodings/encodings"].shape[0]),
        "n_audio_state": int(v["encoder/conv1/weight"].shape[0]),
        "n_audio_head": int(v["encoder/num_heads"]),
        "n_audio_layer": encoder_layers,
        "n_vocab": int(vocab),
        "n_text_ctx": int(v["decoder/position_encodings/encodings"].shape[0]),
        "n_text_state": int(text_state),
        "n_text_head": int(v["decoder/num_heads"]),
        "n_text_layer": decoder_layers,
    }
    return out, dims


def convert(ct2_dir: Path, out_dir: Path) -> None:
    """Write mlx-whisper's `weights.safetensors` and `config.json` for `ct2_dir`."""
    spec, variables = read_ctranslate2(ct2_dir / "model.bin")
    if spec != "WhisperSpec":
        raise WhisperImportError(f"{ct2_dir / 'model.bin'} holds a {spec}, not a Whisper model")
    config_path = ct2_dir / "config.json"
    ct2_config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    try:
        weights, dims = mlx_whisper_weights(variables, ct2_config.get("alignment_heads") or [])
    except KeyError as exc:
        raise WhisperImportError(f"{ct2_dir}: variable {exc} is missing") from exc
    mx.save_safetensors(
        str(out_dir / "weights.safetensors"),
        {name: mx.array(np.ascontiguousarray(a)) for name, a in weights.items()},
    )
    (out_dir / "config.json").write_text(json.dumps({"model_type": "whisper", **dims}, indent=2))


def import_ctranslate2_whisper(ct2_dir: Path, cache_root: Path) -> Path:
    """The mlx-whisper directory for `ct2_dir`, converted on first use and then cached."""
    digest = content_digest(ct2_dir / "model.bin", cache_root / DIGEST_MEMO_DIR)
    parent = cache_root / "whisper"
    target = parent / digest[:_DIGEST_CHARS]
    if all((target / name).is_file() for name in _REQUIRED):
        return target
    parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=parent))
    try:
        convert(ct2_dir, staging)
        staging.chmod(0o755)
        for path in staging.iterdir():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)  # the data on disk before the name says it is there
            finally:
                os.close(fd)
        if target.exists():  # a half-written directory left by something else
            shutil.rmtree(target, ignore_errors=True)
        try:
            os.rename(staging, target)
        except OSError:
            if not all((target / name).is_file() for name in _REQUIRED):
                raise  # not a concurrent importer that published the same digest first
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log.info("whisper_imported", source=str(ct2_dir), model_dir=str(target),
             seconds=round(time.perf_counter() - started, 2))  # fmt: skip
    return target
