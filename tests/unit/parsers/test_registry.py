"""Parsers are found by the names the config uses; unknown names fail with the list."""

from __future__ import annotations

import pytest

from vllm_mlx.parsers import (
    REASONING_PARSERS,
    TOOL_CALL_PARSERS,
    UnknownParserError,
    get_reasoning_parser,
    get_tool_call_parser,
    make_output_parser,
    reasoning_parser_names,
    tool_call_parser_names,
)
from vllm_mlx.parsers.tool_calls.auto import CANDIDATES

TOOL_NAMES = [
    "auto",
    "deepseek",
    "functionary",
    "glm47",
    "granite",
    "hermes",
    "kimi",
    "llama",
    "mistral",
    "nemotron",
    "qwen",
    "xlam",
]


def test_tool_call_parser_names_are_the_documented_set() -> None:
    assert tool_call_parser_names() == TOOL_NAMES
    for name in TOOL_NAMES:
        assert get_tool_call_parser(name) is TOOL_CALL_PARSERS[name]
        assert get_tool_call_parser(name).name == name


def test_reasoning_parser_names_are_the_documented_set() -> None:
    assert reasoning_parser_names() == ["deepseek_r1", "qwen3"]
    for name in reasoning_parser_names():
        assert get_reasoning_parser(name) is REASONING_PARSERS[name]


def test_auto_tries_every_other_parser() -> None:
    assert {cls.name for cls in CANDIDATES} == set(TOOL_NAMES) - {"auto"}


def test_unknown_tool_call_parser_lists_the_valid_names() -> None:
    with pytest.raises(UnknownParserError) as caught:
        get_tool_call_parser("hermes2")
    assert isinstance(caught.value, KeyError)
    message = str(caught.value)
    assert "'hermes2'" in message
    assert all(name in message for name in TOOL_NAMES)
    assert caught.value.valid == tuple(TOOL_NAMES)


def test_unknown_reasoning_parser_lists_the_valid_names() -> None:
    with pytest.raises(UnknownParserError, match="deepseek_r1, qwen3"):
        get_reasoning_parser("think")


@pytest.mark.parametrize(("tool", "reasoning"), [("nope", None), (None, "nope"), ("hermes", "x")])
def test_make_output_parser_rejects_unknown_names(tool: str | None, reasoning: str | None) -> None:
    with pytest.raises(UnknownParserError, match="valid names"):
        make_output_parser(tool, reasoning, None, False)


def test_registries_are_read_only() -> None:
    with pytest.raises(TypeError):
        TOOL_CALL_PARSERS["mine"] = TOOL_CALL_PARSERS["hermes"]  # type: ignore[index]
