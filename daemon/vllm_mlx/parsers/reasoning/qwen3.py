"""``<think>...</think>`` reasoning: Qwen3, QwQ, GLM-4.5+, Kimi K2 Thinking, MiniMax,
and any model whose template follows them.

Qwen3 opens ``<think>`` itself; Qwen3-2507 Thinking and QwQ templates write it into
the prompt, so the output starts inside the block (``starts_in_reasoning``). With
``enable_thinking: false`` the template writes an empty ``<think>\\n\\n</think>`` into
the prompt and the output is all content.
"""

from __future__ import annotations

from vllm_mlx.parsers.reasoning.base import ReasoningParser


class Qwen3ReasoningParser(ReasoningParser):
    name = "qwen3"
