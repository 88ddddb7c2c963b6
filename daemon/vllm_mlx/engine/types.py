"""Neutral engine records: what a request asks for and what generation produces.

Nothing here knows about HTTP or a wire protocol; the OpenAI and Anthropic adapters
both translate to and from these.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field


class FinishReason(enum.StrEnum):
    STOP = "stop"  # end-of-sequence token or a stop string
    LENGTH = "length"  # max_tokens or the context is full
    TOOL_CALLS = "tool_calls"
    ABORT = "abort"  # client gone, timeout, shutdown
    ERROR = "error"


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    repetition_penalty: float | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass
class GenerationRequest:
    request_id: str
    prompt_tokens: list[int]
    max_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: tuple[str, ...] = ()
    arrived_at: float = field(default_factory=time.monotonic)
    # time.monotonic() by which the request must be done; past it, TimeoutError.
    deadline: float | None = None


# Events the engine thread posts to a request's queue (token ids, not text: the
# detokenizer runs on the asyncio side, off the engine thread).


@dataclass(frozen=True)
class PromptProcessed:
    """Prefill is done; the first token follows."""

    at: float
    cached_tokens: int = 0
    started_at: float | None = None  # when the engine began this prompt (queue time ends)


@dataclass(frozen=True)
class TokensGenerated:
    tokens: list[int]


@dataclass(frozen=True)
class SequenceFinished:
    reason: FinishReason
    message: str = ""


EngineEvent = PromptProcessed | TokensGenerated | SequenceFinished


# Events the output stream hands to the protocol adapters.


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class Finished:
    reason: FinishReason
    usage: Usage
    stop_sequence: str | None = None
    message: str = ""


class EngineError(Exception):
    """A request the engine cannot take (bad input); the API maps it to a 400."""


class ContextLengthError(EngineError):
    pass


class EngineUnavailableError(Exception):
    """The engine is stopped or stopping; the API maps it to a 503."""
