"""models[].warm_prompts: text or {file: PATH}; a file that is missing, too large or not
text is an error at its own line."""

from __future__ import annotations

from pathlib import Path

from tests.unit.test_config import issues_of, write
from vllm_mlx.config.model import ModelSettings, warm_texts

SOURCE = "builtin:smollm2-135m-instruct"


def test_text_and_files_are_read_in_order(tmp_path: Path) -> None:
    prompt = tmp_path / "agent.md"
    prompt.write_text("You are a coding agent.\n", encoding="utf-8")
    model = ModelSettings(
        name="m", source=SOURCE, warm_prompts=["Be brief.", {"file": str(prompt)}]
    )
    assert warm_texts(model) == ["Be brief.", "You are a coding agent.\n"]


def test_a_missing_file_is_an_error_at_its_line(tmp_path: Path) -> None:
    text = (
        "models:\n"
        f"  - name: m\n    source: {SOURCE}\n"
        "    warm_prompts:\n"
        "      - Be brief.\n"
        f"      - file: {tmp_path / 'nope.md'}\n"
    )
    ((line, key, message),) = issues_of(write(tmp_path, text))
    assert (line, key) == (6, "models[0].warm_prompts[1].file")
    assert "does not exist" in message


def test_binary_and_huge_files_are_refused(tmp_path: Path) -> None:
    binary = tmp_path / "blob.bin"
    binary.write_bytes(b"\xff\xfe\x00bad")
    huge = tmp_path / "huge.md"
    huge.write_text("x" * (1024 * 1024 + 1))
    for path, words in ((binary, "not UTF-8"), (huge, "larger than 1 MiB")):
        text = f"models:\n  - name: m\n    source: {SOURCE}\n    warm_prompts: [{{file: {path}}}]\n"
        ((_, key, message),) = issues_of(write(tmp_path, text))
        assert key.startswith("models[0].warm_prompts[0]") and words in message
