"""`ollama.listen`: HOST:PORT of an IP literal, errors naming the file, line and key,
and never the address the main listener already holds."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.test_config import issues_of, write
from vllm_mlx.config.file import load_settings
from vllm_mlx.config.ollama import overlaps, parse_address


@pytest.mark.parametrize(
    ("text", "address"),
    [
        ("127.0.0.1:11434", ("127.0.0.1", 11434)),
        ("0.0.0.0:11434", ("0.0.0.0", 11434)),
        ("[::1]:11434", ("::1", 11434)),
        ("::1:11434", ("::1", 11434)),
    ],
)
def test_addresses(text: str, address: tuple[str, int]) -> None:
    assert parse_address(text) == address


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("localhost:11434", "not an IP address"),
        ("127.0.0.1", "not HOST:PORT"),
        ("127.0.0.1:", "not HOST:PORT"),
        (":11434", "not HOST:PORT"),
        ("127.0.0.1:0", "between 1 and 65535"),
        ("127.0.0.1:70000", "between 1 and 65535"),
        ("127.0.0.1:-5", "not HOST:PORT"),
    ],
)
def test_a_bad_address_is_an_error_at_its_line(tmp_path: Path, text: str, says: str) -> None:
    path = write(tmp_path, f"server:\n  port: 8000\nollama:\n  listen: '{text}'\n")
    ((line, key, message),) = issues_of(path)
    assert (line, key) == (4, "ollama.listen") and says in message


@pytest.mark.parametrize("listen", ["127.0.0.1:8000", "0.0.0.0:8000"])
def test_the_main_address_cannot_be_the_second_one(tmp_path: Path, listen: str) -> None:
    path = write(tmp_path, f"server:\n  port: 8000\nollama:\n  listen: {listen}\n")
    ((_, _, message),) = issues_of(path)
    assert "already listen on" in message and "11434" in message


def test_off_by_default_and_apart_from_the_main_port(tmp_path: Path) -> None:
    assert load_settings(write(tmp_path, "server:\n  port: 8000\n")).ollama.address() is None
    path = write(tmp_path, "ollama:\n  listen: 127.0.0.1:11434\n")
    assert load_settings(path).ollama.address() == ("127.0.0.1", 11434)
    assert overlaps(("::", 11434), ("127.0.0.1", 11434))
    assert not overlaps(("127.0.0.1", 11434), ("127.0.0.2", 11434))
    assert not overlaps(("127.0.0.1", 11434), ("127.0.0.1", 8000))
