"""A file's SHA-256, hashed once and then remembered by what `stat` says of the file.

The GGUF importer names its cache by the file's content hash, and every start of the
daemon asked for it again: a few gigabytes of GGUF read and hashed on each restart
(~0.8 GB/s on a 2-core AMD EPYC, so 5-6 s for an 8B model at 4 bits, more from a cold
disk). The hash is now kept in a small JSON file per path under `memo_dir`, with the
file's device, inode, size, mtime and ctime. A later call that finds all five unchanged
returns the remembered hash without reading the file. ctime is the guard against tools
that write new content and then put the old mtime back (`cp -p`, `touch -r`): no
user-level call can set ctime, and every write or rename moves it.

A memo that is missing, unreadable, malformed or stale is ignored and rewritten (write to
a temp file, then rename: a reader never sees half of one), so the cost of any doubt is
one more hash, never a wrong one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pathlib
import tempfile

_CHUNK = 1 << 20
_MEMO_NAME_CHARS = 32


def content_digest(path: pathlib.Path, memo_dir: pathlib.Path) -> str:
    """The hex SHA-256 of `path`'s bytes, from the memo when the file is unchanged."""
    resolved = path.resolve()
    identity = _identity(resolved)
    memo = memo_dir / f"{_memo_name(resolved)}.json"
    remembered = _read_memo(memo)
    if remembered is not None and remembered.get("identity") == identity:
        digest = remembered.get("sha256")
        if isinstance(digest, str) and len(digest) == 64:
            return digest
    digest = _hash(resolved)
    # The file may have changed while it was read: remember the hash only if not.
    if _identity(resolved) == identity:
        _write_memo(memo, {"path": str(resolved), "identity": identity, "sha256": digest})
    return digest


def _identity(path: pathlib.Path) -> list[int]:
    st = path.stat()
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _memo_name(path: pathlib.Path) -> str:
    return hashlib.sha256(os.fsencode(path)).hexdigest()[:_MEMO_NAME_CHARS]


def _hash(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _read_memo(memo: pathlib.Path) -> dict[str, object] | None:
    try:
        loaded = json.loads(memo.read_bytes())
    except (OSError, ValueError):
        return None
    return loaded if isinstance(loaded, dict) else None


def _write_memo(memo: pathlib.Path, content: dict[str, object]) -> None:
    """Best effort: a cache directory that cannot be written costs a hash next time."""
    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        fd, staging = tempfile.mkstemp(prefix=f".{memo.name}.", dir=memo.parent)
    except OSError:
        return
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(content, f)
        os.replace(staging, memo)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(staging)
