"""Reasoning parsers, chosen by name from the model's config (``reasoning_parser``)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from vllm_mlx.parsers.errors import UnknownParserError
from vllm_mlx.parsers.reasoning.base import ReasoningEvent, ReasoningParser
from vllm_mlx.parsers.reasoning.deepseek_r1 import DeepSeekR1ReasoningParser
from vllm_mlx.parsers.reasoning.qwen3 import Qwen3ReasoningParser

REASONING_PARSERS: Mapping[str, type[ReasoningParser]] = MappingProxyType(
    {cls.name: cls for cls in (Qwen3ReasoningParser, DeepSeekR1ReasoningParser)}
)


def reasoning_parser_names() -> list[str]:
    return sorted(REASONING_PARSERS)


def get_reasoning_parser(name: str) -> type[ReasoningParser]:
    try:
        return REASONING_PARSERS[name]
    except KeyError:
        raise UnknownParserError("reasoning", name, reasoning_parser_names()) from None


__all__ = [
    "REASONING_PARSERS",
    "ReasoningEvent",
    "ReasoningParser",
    "UnknownParserError",
    "get_reasoning_parser",
    "reasoning_parser_names",
]
