"""models/file_digest.py: a file's SHA-256 is hashed once, then taken from the memo while
device, inode, size, mtime and ctime are unchanged; any change or doubt hashes again."""

from __future__ import annotations

import hashlib
import json
import os
import pathlib

import pytest

from vllm_mlx.models import file_digest
from vllm_mlx.models.file_digest import content_digest

CONTENT = b"GGUF" + bytes(range(256)) * 4096


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def only_memo(memo_dir: pathlib.Path) -> pathlib.Path:
    memos = list(memo_dir.iterdir())
    assert len(memos) == 1, memos  # and no staging file left beside it
    return memos[0]


def plant(memo_dir: pathlib.Path, digest: str) -> None:
    """Overwrite the memo's hash, keeping its file identity: what a later call returns
    then shows whether it read the memo or the file."""
    memo = only_memo(memo_dir)
    content = json.loads(memo.read_text())
    memo.write_text(json.dumps({**content, "sha256": digest}))


def test_first_call_hashes_and_a_later_one_reads_the_memo(tmp_path: pathlib.Path) -> None:
    path, memo_dir = tmp_path / "model.gguf", tmp_path / "memos"
    path.write_bytes(CONTENT)
    assert content_digest(path, memo_dir) == sha256(CONTENT)
    memo = json.loads(only_memo(memo_dir).read_text())
    assert memo["path"] == str(path.resolve()) and memo["sha256"] == sha256(CONTENT)
    plant(memo_dir, "f" * 64)
    assert content_digest(path, memo_dir) == "f" * 64


def test_new_bytes_with_the_old_size_and_mtime_are_hashed_again(tmp_path: pathlib.Path) -> None:
    path, memo_dir = tmp_path / "model.gguf", tmp_path / "memos"
    path.write_bytes(CONTENT)
    content_digest(path, memo_dir)
    before = path.stat()
    changed = bytes(reversed(CONTENT))
    path.write_bytes(changed)  # same size, same inode
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))  # as `cp -p` leaves it
    assert path.stat().st_mtime_ns == before.st_mtime_ns
    assert content_digest(path, memo_dir) == sha256(changed)
    assert json.loads(only_memo(memo_dir).read_text())["sha256"] == sha256(changed)


def test_a_file_renamed_over_the_path_is_hashed_again(tmp_path: pathlib.Path) -> None:
    path, memo_dir = tmp_path / "model.gguf", tmp_path / "memos"
    path.write_bytes(CONTENT)
    content_digest(path, memo_dir)
    fresh = tmp_path / "download.part"
    fresh.write_bytes(CONTENT[:-1] + b"!")
    fresh.replace(path)  # how a download lands: a new inode under the old name
    assert content_digest(path, memo_dir) == sha256(CONTENT[:-1] + b"!")


def test_each_path_has_its_own_memo(tmp_path: pathlib.Path) -> None:
    memo_dir = tmp_path / "memos"
    first, second = tmp_path / "a.gguf", tmp_path / "b.gguf"
    first.write_bytes(CONTENT)
    second.write_bytes(CONTENT)
    assert content_digest(first, memo_dir) == content_digest(second, memo_dir)
    assert len(list(memo_dir.iterdir())) == 2


def test_a_broken_memo_costs_a_hash_and_is_rewritten(tmp_path: pathlib.Path) -> None:
    path, memo_dir = tmp_path / "model.gguf", tmp_path / "memos"
    path.write_bytes(CONTENT)
    content_digest(path, memo_dir)
    memo = only_memo(memo_dir)
    for broken in (b"", b"{", b"[1, 2]", b'{"identity": [], "sha256": 7}', b"\xff\xfe"):
        memo.write_bytes(broken)
        assert content_digest(path, memo_dir) == sha256(CONTENT)
        assert json.loads(only_memo(memo_dir).read_text())["sha256"] == sha256(CONTENT)
    plant(memo_dir, "short")  # the identity matches, the hash is not one
    assert content_digest(path, memo_dir) == sha256(CONTENT)


def test_a_memo_directory_that_cannot_be_written_still_gives_the_hash(
    tmp_path: pathlib.Path,
) -> None:
    path = tmp_path / "model.gguf"
    path.write_bytes(CONTENT)
    blocked = tmp_path / "memos"
    blocked.write_text("a file where the directory would go")
    assert content_digest(path, blocked) == sha256(CONTENT)
    assert content_digest(path, blocked) == sha256(CONTENT)
    assert blocked.read_text() == "a file where the directory would go"


def test_a_file_that_changes_while_it_is_hashed_is_not_remembered(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, memo_dir = tmp_path / "model.gguf", tmp_path / "memos"
    path.write_bytes(CONTENT)
    read = file_digest._hash

    def read_then_append(target: pathlib.Path) -> str:
        digest = read(target)
        with target.open("ab") as f:  # a download still being written
            f.write(b"more")
        return digest

    monkeypatch.setattr(file_digest, "_hash", read_then_append)
    assert content_digest(path, memo_dir) == sha256(CONTENT)
    assert not memo_dir.exists() or list(memo_dir.iterdir()) == []
    monkeypatch.undo()
    assert content_digest(path, memo_dir) == sha256(CONTENT + b"more")
