"""The GGUF header reader steps over arrays of strings (a vocabulary and its merges)
without decoding them, and still refuses one that runs past the end of the file."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from tests.unit.test_config_errors import LLAMA_KEYS, gguf_text
from vllm_mlx.models.gguf_header import GGUFHeader, GGUFHeaderError, read_gguf_header
from vllm_mlx.models.sources import builtin_path

TENSOR = "blk.0.attn_q.weight"


def with_strings(count: int, strings: list[bytes], *, cut: int = 0) -> bytes:
    """A llama GGUF whose metadata holds `tokenizer.ggml.tokens`: an array that says it
    has `count` strings and holds `strings`; then one tensor. `cut` bytes dropped from the
    end of the array (the file ends there)."""
    kv = gguf_text("general.architecture") + struct.pack("<I", 8) + gguf_text("llama")
    kv += b"".join(gguf_text(key) + struct.pack("<II", 4, 1) for key in LLAMA_KEYS)
    array = b"".join(struct.pack("<Q", len(s)) + s for s in strings)
    kv += gguf_text("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, count) + array
    head = b"GGUF" + struct.pack("<IQQ", 3, 1, len(LLAMA_KEYS) + 2)
    if cut:
        return head + kv[:-cut]
    info = gguf_text(TENSOR) + struct.pack("<IQIQ", 1, 4, 0, 0)
    return head + kv + info + bytes(64)


def read(tmp_path: Path, content: bytes) -> GGUFHeader:
    path = tmp_path / "model.gguf"
    path.write_bytes(content)
    return read_gguf_header(path)


def test_a_string_array_is_stepped_over_to_the_tensors(tmp_path: Path) -> None:
    strings = [b"", b"a", "\u00e9t\u00e9".encode(), b"\xff\xfe not utf-8", b"x" * 300]
    header = read(tmp_path, with_strings(len(strings), strings))
    assert header.architecture == "llama" and header.tensor_count == 1


@pytest.mark.parametrize("cut", [1, 8, 9, 300])
def test_a_string_array_cut_short_is_refused(tmp_path: Path, cut: int) -> None:
    with pytest.raises(GGUFHeaderError, match="truncated header"):
        read(tmp_path, with_strings(5, [b"", b"a", b"bc", b"d" * 200, b"e" * 100], cut=cut))


def test_a_count_past_the_file_is_refused_not_looped_over(tmp_path: Path) -> None:
    # 2**62 empty strings would be a loop for ever; each costs 8 bytes, so the end of the
    # file comes first.
    with pytest.raises(GGUFHeaderError, match="truncated header"):
        read(tmp_path, with_strings(2**62, [b""] * 10))


def test_a_string_longer_than_the_file_is_refused(tmp_path: Path) -> None:
    content = with_strings(1, [b"abc"])
    at = content.index(struct.pack("<Q", 3) + b"abc")
    forged = content[:at] + struct.pack("<Q", 2**60) + content[at + 8 :]
    with pytest.raises(GGUFHeaderError, match="truncated header"):
        read(tmp_path, forged)


def test_the_bundled_model_reads_to_its_tensor_data() -> None:
    header = read_gguf_header(builtin_path("smollm2-135m-instruct"))
    assert (header.architecture, header.tensor_count) == ("llama", 272)
    assert header.data_offset == 1_785_664  # past the vocabulary and merges, aligned
