"""Format detection: every other parser watches the output, the first to find a call
in its own format wins.

Candidates are tried in the order below, most distinctive markers first, so that an
ambiguous region (``<tool_call>`` is shared by five formats) goes to the parser that
reads the most shapes of it. Use a named parser when you know the model: ``auto``
holds back a little more text while it rules formats out.
"""

from __future__ import annotations

from collections.abc import Sequence

from vllm_mlx.parsers.tool_calls.base import RawCall, Region, ToolCallParser
from vllm_mlx.parsers.tool_calls.deepseek import DeepSeekToolCallParser
from vllm_mlx.parsers.tool_calls.functionary import FunctionaryToolCallParser
from vllm_mlx.parsers.tool_calls.glm47 import Glm47ToolCallParser
from vllm_mlx.parsers.tool_calls.granite import GraniteToolCallParser
from vllm_mlx.parsers.tool_calls.hermes import HermesToolCallParser
from vllm_mlx.parsers.tool_calls.kimi import KimiToolCallParser
from vllm_mlx.parsers.tool_calls.llama import LlamaToolCallParser
from vllm_mlx.parsers.tool_calls.mistral import MistralToolCallParser
from vllm_mlx.parsers.tool_calls.nemotron import NemotronToolCallParser
from vllm_mlx.parsers.tool_calls.qwen import QwenToolCallParser
from vllm_mlx.parsers.tool_calls.xlam import XlamToolCallParser
from vllm_mlx.parsers.types import ToolSpec

CANDIDATES: tuple[type[ToolCallParser], ...] = (
    DeepSeekToolCallParser,
    KimiToolCallParser,
    MistralToolCallParser,
    QwenToolCallParser,
    Glm47ToolCallParser,
    GraniteToolCallParser,
    NemotronToolCallParser,
    FunctionaryToolCallParser,
    LlamaToolCallParser,
    XlamToolCallParser,
    HermesToolCallParser,
)


class AutoToolCallParser(ToolCallParser):
    name = "auto"

    def __init__(self, tools: Sequence[ToolSpec] | None) -> None:
        super().__init__(tools)
        self._formats = [cls(tools) for cls in CANDIDATES]
        self._chosen: ToolCallParser | None = None

    def find_start(self, text: str, *, at_start: bool, final: bool) -> tuple[int, int]:
        start, held = len(text), len(text)
        for parser in self._formats:
            found, safe = parser.find_start(text, at_start=at_start, final=final)
            if found >= 0:
                start = min(start, found)
            else:
                held = min(held, safe)
        # As in StartPatterns.find: a format still undecided at the same place wins time.
        if start < held:
            return start, start
        return -1, min(start, held)

    def take_region(self, text: str, *, at_start: bool, final: bool) -> Region | None:
        # Decide only once every earlier candidate has decided, so the winner depends
        # on the text alone and not on where the chunks happened to split.
        fallback = len(text)
        for parser in self._formats:
            if parser.find_start(text, at_start=at_start, final=True)[0] != 0:
                continue
            taken = parser.take_region(text, at_start=at_start, final=final)
            if taken is None:
                return None
            end, raws = taken
            if raws is not None and parser.accept(raws) is not None:
                self._chosen = parser
                return taken
            fallback = min(fallback, end)
        return fallback, None

    def make_id(self, raw: RawCall) -> str:
        if self._chosen is None:
            return super().make_id(raw)
        return self._chosen.make_id(raw)
