"""The paged prefix cache's disk tier: KV blocks that survive a restart.

Each block the memory tier stores is also written, by a writer thread, to one file named
by its chain key (paged.py: the key digests the whole prefix up to the block's end)
inside a directory named by the model's identity: its weight files, its config and the
dtypes and shapes of its parameters as loaded, so a different model, another
quantization or the float32 path can never read another's blocks. A lookup that misses
memory reads the next blocks of the prompt's chain from here.

A file is a small header (JSON: the parent key, the block's tokens, shapes, dtypes and
a blake2b digest of the payload) and the raw keys and values. A file that is short, does
not parse or whose digest differs is deleted and counted, never served. The directory is
bounded: least recently used files go first, before a write. Writes never stall the
engine: the queue is bounded, and a block that does not fit the queue is not written.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import queue
import struct
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import structlog

log = structlog.get_logger(__name__)

MAGIC = b"VMKV1\n"
SUFFIX = ".kv"
QUEUE_BLOCKS = 1024  # blocks waiting for the writer; more are dropped, never waited for
# Raw bytes go through an unsigned integer view of the same width (numpy has no bfloat16).
_UINT = {2: mx.uint16, 4: mx.uint32, 1: mx.uint8}
_DTYPES = {str(d): d for d in (mx.float16, mx.bfloat16, mx.float32, mx.uint8)}


@dataclass
class DiskStats:
    reads: int = 0  # blocks read back (a memory miss served from disk)
    writes: int = 0
    dropped: int = 0  # writes not queued: the writer was behind
    corrupt: int = 0  # files dropped: truncated, unparsable or a digest mismatch
    evictions: int = 0


@dataclass(frozen=True)
class DiskBlock:
    """To the writer: keys and values as unsigned integers of their width (as_disk_block);
    from `get`: in their own dtype again."""

    keys: mx.array
    values: mx.array
    parent: bytes
    tokens: tuple[int, ...]
    dtype: str  # the arrays' own dtype, e.g. "mlx.core.float32"


def model_identity(directory: str, model: Any) -> str:
    """A digest naming one model as loaded: its files (names, sizes, and the first and
    last MiB of each weight file, so a fine-tune of the same shapes differs) and its
    parameters' names, dtypes and shapes (another quantization or dtype path differs)."""
    from mlx.utils import tree_flatten

    digest = hashlib.blake2b(digest_size=16)
    root = Path(directory)
    for path in sorted(root.iterdir()) if root.is_dir() else ():
        if not path.is_file():
            continue
        size = path.stat().st_size
        digest.update(f"{path.name}:{size}".encode())
        if path.suffix in (".safetensors", ".gguf", ".json", ".bin"):
            with path.open("rb") as handle:
                digest.update(handle.read(2**20))
                if size > 2**21:
                    handle.seek(-(2**20), os.SEEK_END)
                    digest.update(handle.read())
    parameters: list[tuple[str, Any]] = tree_flatten(model.parameters())  # type: ignore[assignment]
    for name, array in parameters:
        digest.update(f"{name}:{array.dtype}:{tuple(array.shape)}".encode())
    return digest.hexdigest()


class DiskBlockStore:
    """One model's directory of blocks, at most `max_bytes` of files."""

    def __init__(self, directory: Path, max_bytes: int) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self.stats = DiskStats()
        directory.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()  # the index: engine thread reads, writer writes
        self._index: OrderedDict[str, int] = OrderedDict()  # key hex -> file bytes, LRU
        self._nbytes = 0
        self._scan()
        self._queue: queue.Queue[tuple[bytes, DiskBlock] | None] = queue.Queue(QUEUE_BLOCKS)
        self._writer = threading.Thread(target=self._write_loop, name="kv-disk", daemon=True)
        self._writer.start()

    def _scan(self) -> None:
        files = []
        for path in self.directory.glob(f"*{SUFFIX}"):
            try:
                stat = path.stat()
            except OSError:
                continue
            files.append((stat.st_mtime_ns, path.stem, stat.st_size))
        for _, key, size in sorted(files):  # oldest first: the LRU order survives
            self._index[key] = size
            self._nbytes += size
        for leftover in self.directory.glob("*.tmp"):
            leftover.unlink(missing_ok=True)  # a write cut short by a crash

    @property
    def entries(self) -> int:
        return len(self._index)

    @property
    def nbytes(self) -> int:
        return self._nbytes

    def summary(self) -> dict[str, Any]:
        """The `disk` block of a model's cache in /v1/status and /v1/cache/stats."""
        stats = self.stats
        return {
            "entries": self.entries,
            "disk_mb": round(self.nbytes / 2**20, 3),
            "max_disk_mb": round(self.max_bytes / 2**20, 3),
            "reads": stats.reads,
            "writes": stats.writes,
            "dropped": stats.dropped,
            "corrupt": stats.corrupt,
            "evictions": stats.evictions,
        }

    def __contains__(self, key: bytes) -> bool:
        with self._lock:
            return key.hex() in self._index

    # --- engine thread -------------------------------------------------------------------

    def put(self, key: bytes, block: DiskBlock) -> None:
        """Queue a block for writing (its arrays evaluated); dropped if the writer lags."""
        if key in self:
            return
        try:
            self._queue.put_nowait((key, block))
        except queue.Full:
            self.stats.dropped += 1

    def get(self, key: bytes, tokens: Sequence[int]) -> DiskBlock | None:
        """The block stored under `key` whose tokens are `tokens`, or None."""
        name = key.hex()
        with self._lock:
            if name not in self._index:
                return None
            self._index.move_to_end(name)
        path = self._path(name)
        try:
            block = _decode(path.read_bytes())
        except FileNotFoundError:
            self._forget(name)
            return None
        except (ValueError, KeyError, struct.error, json.JSONDecodeError) as exc:
            log.warning("prefix cache file dropped", file=str(path), reason=str(exc))
            self.stats.corrupt += 1
            self._forget(name)
            path.unlink(missing_ok=True)
            return None
        if block.tokens != tuple(tokens):
            return None  # another prefix under a colliding key: never served
        os.utime(path)  # the LRU order after a restart
        self.stats.reads += 1
        return block

    def clear(self) -> int:
        """Delete every file (and the writes still queued); returns how many files."""
        with contextlib.suppress(queue.Empty):
            while True:
                item = self._queue.get_nowait()
                if item is None:  # closing: leave the writer its stop
                    self._queue.put(None)
                    break
        with self._lock:
            names = list(self._index)
            self._index.clear()
            self._nbytes = 0
        for name in names:
            self._path(name).unlink(missing_ok=True)
        return len(names)

    def close(self) -> None:
        self._queue.put(None)
        self._writer.join(10)

    # --- writer thread -------------------------------------------------------------------

    def _write_loop(self) -> None:
        while (item := self._queue.get()) is not None:
            key, block = item
            try:
                self._write(key.hex(), _encode(block))
            except Exception:
                log.exception("prefix cache write failed", directory=str(self.directory))

    def _write(self, name: str, data: bytes) -> None:
        size = len(data)
        if size > self.max_bytes:
            return
        with self._lock:
            if name in self._index:
                return
            while self._index and self._nbytes + size > self.max_bytes:
                old, old_size = self._index.popitem(last=False)
                self._nbytes -= old_size
                self._path(old).unlink(missing_ok=True)
                self.stats.evictions += 1
        temp = self.directory / f"{name}.tmp"
        temp.write_bytes(data)
        os.replace(temp, self._path(name))  # whole or absent: a crash leaves only a .tmp
        with self._lock:
            self._index[name] = size
            self._nbytes += size
        self.stats.writes += 1

    def _forget(self, name: str) -> None:
        with self._lock:
            size = self._index.pop(name, None)
            if size is not None:
                self._nbytes -= size

    def _path(self, name: str) -> Path:
        return self.directory / f"{name}{SUFFIX}"


def as_disk_block(
    keys: mx.array, values: mx.array, parent: bytes, tokens: tuple[int, ...]
) -> DiskBlock:
    """A block's arrays viewed as unsigned integers of their width (the caller evaluates
    them with the block), so the writer thread only copies bytes, never runs MLX."""
    if str(keys.dtype) not in _DTYPES or keys.dtype != values.dtype:
        raise ValueError(f"no disk format for KV of dtype {keys.dtype}")
    width = _UINT[keys.dtype.size]
    return DiskBlock(keys.view(width), values.view(width), parent, tokens, str(keys.dtype))


def _encode(block: DiskBlock) -> bytes:
    payload = [np.asarray(block.keys).tobytes(), np.asarray(block.values).tobytes()]
    body = b"".join(payload)
    header = {
        "parent": block.parent.hex(),
        "tokens": list(block.tokens),
        "shape": list(block.keys.shape),
        "values_shape": list(block.values.shape),
        "width": block.keys.dtype.size,
        "dtype": block.dtype,
        "digest": hashlib.blake2b(body, digest_size=16).hexdigest(),
    }
    raw = json.dumps(header).encode()
    return MAGIC + struct.pack("<I", len(raw)) + raw + body


def _decode(data: bytes) -> DiskBlock:
    if not data.startswith(MAGIC):
        raise ValueError("not a prefix cache block")
    (length,) = struct.unpack_from("<I", data, len(MAGIC))
    start = len(MAGIC) + 4
    header = json.loads(data[start : start + length])
    body = data[start + length :]
    if hashlib.blake2b(body, digest_size=16).hexdigest() != header["digest"]:
        raise ValueError("checksum mismatch (truncated or altered)")
    width = int(header["width"])
    shape, values_shape = tuple(header["shape"]), tuple(header["values_shape"])
    split = int(np.prod(shape)) * width
    if split > len(body):
        raise ValueError("shorter than its header says")
    dtype = np.dtype(f"<u{width}")
    if len(body) != split + int(np.prod(values_shape)) * width:
        raise ValueError("a different size than its header says")
    own = _DTYPES[header["dtype"]]
    keys = mx.array(np.frombuffer(body[:split], dtype).reshape(shape)).view(own)
    values = mx.array(np.frombuffer(body[split:], dtype).reshape(values_shape)).view(own)
    parent = bytes.fromhex(header["parent"])
    return DiskBlock(keys, values, parent, tuple(header["tokens"]), header["dtype"])
