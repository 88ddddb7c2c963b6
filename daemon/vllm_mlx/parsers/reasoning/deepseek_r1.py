"""DeepSeek R1 (and its distills) and DeepSeek V3.1 in thinking mode.

R1 may start reasoning without writing ``<think>``: its template often puts the tag
in the prompt, and older versions left it out altogether. So unless the prompt shows
thinking was switched off (it ends in ``</think>``, as V3.1's non-thinking template
does), everything before ``</think>`` is reasoning.
"""

from __future__ import annotations

from vllm_mlx.parsers.reasoning.base import ReasoningParser


class DeepSeekR1ReasoningParser(ReasoningParser):
    name = "deepseek_r1"

    def __init__(self, *, starts_in_reasoning: bool = True) -> None:
        super().__init__(starts_in_reasoning=starts_in_reasoning)

    @classmethod
    def prompt_opens_reasoning(cls, prompt_text: str) -> bool:
        if super().prompt_opens_reasoning(prompt_text):
            return True
        return not prompt_text.rstrip().endswith(cls.close_tag)
