"""Splits a model's output into reasoning and the answer that follows it.

The reasoning sits between an open and a close tag (``<think>``/``</think>``). When
the chat template already wrote the open tag into the prompt, the output starts
inside the reasoning: pass ``starts_in_reasoning=True`` (see prompt_opens_reasoning).
"""

from __future__ import annotations

from typing import ClassVar

from vllm_mlx.parsers._text import WhitespaceTrim, skip_space
from vllm_mlx.parsers.types import ContentDelta, ParsedOutput, ReasoningDelta, collect_events

ReasoningEvent = ContentDelta | ReasoningDelta


class ReasoningParser:
    name: ClassVar[str] = ""
    open_tag: ClassVar[str] = "<think>"
    close_tag: ClassVar[str] = "</think>"

    def __init__(self, *, starts_in_reasoning: bool = False) -> None:
        self.starts_in_reasoning = starts_in_reasoning
        self._buffer = ""
        self._state = "opening"  # -> "reasoning" -> "content", or "opening" -> "content"
        self._reasoning = WhitespaceTrim()
        self._content = WhitespaceTrim()

    @classmethod
    def prompt_opens_reasoning(cls, prompt_text: str) -> bool:
        """True when the rendered prompt leaves a reasoning block open for the model."""
        return prompt_text.rfind(cls.open_tag) > prompt_text.rfind(cls.close_tag)

    def feed(self, text: str) -> list[ReasoningEvent]:
        self._buffer += text
        return self._drain(final=False)

    def finish(self) -> list[ReasoningEvent]:
        return self._drain(final=True)

    def parse(self, text: str) -> ParsedOutput:
        fresh = self.spawn()
        return collect_events([*fresh.feed(text), *fresh.finish()])

    def spawn(self) -> ReasoningParser:
        return type(self)(starts_in_reasoning=self.starts_in_reasoning)

    def _drain(self, *, final: bool) -> list[ReasoningEvent]:
        events: list[ReasoningEvent] = []
        if self._state == "opening":
            self._open(final)
        if self._state == "reasoning":
            self._reason(events, final)
        if self._state == "content" and self._buffer:
            visible = self._content.push(self._buffer)
            self._buffer = ""
            if visible:
                events.append(ContentDelta(visible))
        return events

    def _open(self, final: bool) -> None:
        """Decide, from the first non-blank text, whether an open tag starts the output."""
        rest = self._buffer[skip_space(self._buffer, 0) :]
        if rest.startswith(self.open_tag):
            self._buffer = rest[len(self.open_tag) :]
            self._state = "reasoning"
        elif self.open_tag.startswith(rest) and not final:
            return  # blank or a piece of the open tag so far: wait
        else:
            # A template that opened the block in the prompt: no tag to see, but the
            # model thinks first. Otherwise there is no reasoning at all.
            self._state = "reasoning" if self.starts_in_reasoning else "content"

    def _reason(self, events: list[ReasoningEvent], final: bool) -> None:
        close = self._buffer.find(self.close_tag)
        if close >= 0:
            thought, self._buffer = (
                self._buffer[:close],
                self._buffer[close + len(self.close_tag) :],
            )
            self._state = "content"
        else:
            keep = 0 if final else _partial_suffix(self._buffer, self.close_tag)
            thought = self._buffer[: len(self._buffer) - keep]
            self._buffer = self._buffer[len(thought) :]
        visible = self._reasoning.push(thought)
        if visible:
            events.append(ReasoningDelta(visible))


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of ``text`` that is a proper start of ``marker``."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0
