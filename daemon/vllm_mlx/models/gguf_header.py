"""Read a GGUF file's header without mlx: the check `check-config` and `serve` share.

It parses what precedes the tensor data (magic, version, metadata, tensor table) and
checks what the importer (models/gguf.py) needs of it, so a file that is not a GGUF, a
truncated one or an unsupported architecture fails at config validation, with the
config file's line, instead of when the weights load. Tensor data is not read.
No mlx import here: config validation runs before the BLAS is chosen (models/cpu/blas.py).
"""

from __future__ import annotations

import functools
import mmap
import re
import struct
from dataclasses import dataclass
from pathlib import Path

MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
SUPPORTED_ARCHITECTURES = ("llama",)  # what models/gguf.py converts
DEFAULT_ALIGNMENT = 32

# llama.cpp tensor names -> mlx-lm (Hugging Face) module names; models/gguf.py renames
# with these, and the header check refuses a tensor they do not cover.
GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
TENSOR_RE = re.compile(r"^(?:blk\.(\d+)\.)?([a-z_]+)\.(weight|scales|biases)$")
# Metadata the importer cannot do without (models/gguf.py `_model_config`).
REQUIRED_KEYS = tuple(
    f"llama.{key}"
    for key in (
        "embedding_length",
        "attention.head_count",
        "feed_forward_length",
        "block_count",
        "attention.layer_norm_rms_epsilon",
        "context_length",
    )
)

# GGUF metadata value types -> struct format of a scalar (8: string, 9: array).
_SCALARS = {
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "?",
    10: "Q",
    11: "q",
    12: "d",
}
_STRING, _ARRAY = 8, 9
_LENGTH = struct.Struct("<Q")  # a string's byte count, before its bytes
_MAX_DIMS = 8


class GGUFHeaderError(ValueError):
    """The file is not a GGUF file this daemon can import."""


@dataclass(frozen=True)
class GGUFHeader:
    version: int
    architecture: str
    tensor_count: int
    data_offset: int


class _Reader:
    def __init__(self, data: mmap.mmap | bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, size: int) -> bytes:
        if size < 0 or self.pos + size > len(self.data):
            raise GGUFHeaderError(f"truncated header (needs byte {self.pos + size})")
        chunk = self.data[self.pos : self.pos + size]
        self.pos += size
        return bytes(chunk)

    def unpack(self, fmt: str) -> int | float | bool:
        value: int | float | bool = struct.unpack("<" + fmt, self.take(struct.calcsize(fmt)))[0]
        return value

    def count(self) -> int:
        return int(self.unpack("Q"))

    def string(self) -> str:
        return self.take(self.count()).decode("utf-8", errors="replace")

    def skip_strings(self, length: int) -> None:
        """Step over `length` strings without copying or decoding them: a vocabulary and
        its merges are ~100k strings, and decoding each took 270 ms of every start (the
        config check reads the header). Each string costs at least its 8-byte length, so
        a corrupt count runs into the end of the file, not a long loop."""
        data, pos, end = self.data, self.pos, len(self.data)
        for _ in range(length):
            if pos + 8 > end:
                raise GGUFHeaderError(f"truncated header (needs byte {pos + 8})")
            pos += 8 + _LENGTH.unpack_from(data, pos)[0]
        if pos > end:
            raise GGUFHeaderError(f"truncated header (needs byte {pos})")
        self.pos = pos

    def value(self, kind: int, depth: int = 0) -> object:
        if kind in _SCALARS:
            return self.unpack(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind != _ARRAY or depth > 2:
            raise GGUFHeaderError(f"unknown metadata value type {kind} at byte {self.pos}")
        item_kind, length = int(self.unpack("I")), self.count()
        if item_kind in _SCALARS:  # skip fixed-size arrays without decoding them
            self.take(length * struct.calcsize(_SCALARS[item_kind]))
            return None
        if item_kind == _STRING:
            self.skip_strings(length)
            return None
        for _ in range(length):
            self.value(item_kind, depth + 1)
        return None


def read_gguf_header(path: Path) -> GGUFHeader:
    """Parse and check the header; raise GGUFHeaderError saying what is wrong."""
    try:
        stat = path.stat()
    except OSError as exc:
        raise GGUFHeaderError(f"cannot read {path}: {exc.strerror}") from exc
    return _cached_header(str(path), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=32)
def _cached_header(path: str, size: int, mtime_ns: int) -> GGUFHeader:
    # Keyed on size and mtime: hot reloads re-validate the config without re-parsing.
    try:
        with open(path, "rb") as file:
            if size < 24:
                return _parse(file.read(), path)
            with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
                return _parse(data, path)
    except OSError as exc:
        raise GGUFHeaderError(f"cannot read {path}: {exc.strerror}") from exc


def _parse(data: mmap.mmap | bytes, path: str) -> GGUFHeader:
    reader = _Reader(data)
    if data[:4] != MAGIC:
        raise GGUFHeaderError(f"{path} is not a GGUF file (it does not start with 'GGUF')")
    try:
        return _parse_after_magic(reader, len(data))
    except GGUFHeaderError as exc:
        raise GGUFHeaderError(f"{path}: {exc}") from exc


def _parse_after_magic(reader: _Reader, size: int) -> GGUFHeader:
    reader.take(4)
    version = int(reader.unpack("I"))
    if version not in SUPPORTED_VERSIONS:
        raise GGUFHeaderError(f"unsupported GGUF version {version} (supported: 2, 3)")
    tensor_count, kv_count = reader.count(), reader.count()
    if tensor_count > size or kv_count > size:
        raise GGUFHeaderError("corrupt header (impossible tensor or metadata count)")
    metadata: dict[str, object] = {}
    for _ in range(kv_count):
        key = reader.string()
        metadata[key] = reader.value(int(reader.unpack("I")))
    architecture = str(metadata.get("general.architecture", ""))
    if architecture not in SUPPORTED_ARCHITECTURES:
        raise GGUFHeaderError(
            f"unsupported GGUF architecture {architecture or 'none'!r} "
            f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    _check_metadata(metadata)
    last_offset = 0
    for _ in range(tensor_count):
        _check_tensor_name(reader.string())
        dims = int(reader.unpack("I"))
        if dims > _MAX_DIMS:
            raise GGUFHeaderError(f"corrupt tensor table ({dims} dimensions)")
        reader.take(8 * dims + 4)  # the shape and the ggml type
        last_offset = max(last_offset, reader.count())
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    alignment = alignment if isinstance(alignment, int) and alignment > 0 else DEFAULT_ALIGNMENT
    data_offset = -(-reader.pos // alignment) * alignment
    if tensor_count and data_offset + last_offset >= size:
        raise GGUFHeaderError(
            f"truncated: a tensor starts at byte {data_offset + last_offset}, the file has {size}"
        )
    return GGUFHeader(version, architecture, tensor_count, data_offset)


def _check_metadata(metadata: dict[str, object]) -> None:
    missing = [key for key in REQUIRED_KEYS if key not in metadata]
    if missing:
        raise GGUFHeaderError(f"GGUF metadata lacks {', '.join(missing)}")
    if "llama.rope.scaling.type" in metadata:
        raise GGUFHeaderError("GGUF rope scaling is not supported yet")


def _check_tensor_name(name: str) -> None:
    if name == "rope_freqs.weight":
        raise GGUFHeaderError("GGUF rope_freqs (Llama 3.1 rope) is not supported yet")
    match = TENSOR_RE.match(name)
    table = GLOBAL_NAMES if match is None or match.group(1) is None else BLOCK_NAMES
    if match is None or match.group(2) not in table:
        raise GGUFHeaderError(f"unexpected GGUF tensor {name!r}")
