"""Neutral engine records: what a request asks for and what generation produces.

Nothing here knows about HTTP or a wire protocol; the OpenAI and Anthropic adapters
both translate to and from these.
"""

from __future__ import annotations

import enum
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:
    from vllm_mlx.models.vision import ImageTiles

# Seeds the engine takes: any 64-bit integer, signed or unsigned (folded into uint64).
SEED_MIN = -(2**63)
SEED_MAX = 2**64 - 1


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
    # How many of the latest generated tokens the three penalties look at (Ollama's
    # repeat_last_n); None: all of them, as OpenAI's penalties do.
    penalty_window: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def problems(self, vocab_size: int) -> Iterator[tuple[str, str]]:
        """(field, message) for every value the engine cannot sample with.

        The API boundary reports the first as a 400 naming the field; the engine runs
        the same checks again and refuses the request alone (never the batch).
        """
        for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty"):
            if not math.isfinite(getattr(self, name)):
                yield name, f"{name} must be a finite number"
        if self.temperature < 0:
            yield "temperature", "temperature must be at least 0"
        if not 0 < self.top_p <= 1:
            yield "top_p", "top_p must be in (0, 1]"
        if not 0 <= self.min_p <= 1:
            yield "min_p", "min_p must be in [0, 1]"
        if self.top_k < 0:
            yield "top_k", "top_k must be at least 0 (0 turns it off)"
        penalty = self.repetition_penalty
        if penalty is not None and not (math.isfinite(penalty) and penalty > 0):
            yield "repetition_penalty", "repetition_penalty must be a positive number"
        if self.penalty_window is not None and self.penalty_window < 1:
            yield "penalty_window", "the penalty window must be at least 1 token"
        if self.seed is not None and not SEED_MIN <= self.seed <= SEED_MAX:
            yield "seed", f"seed must be a 64-bit integer ({SEED_MIN} to {SEED_MAX})"
        for token, bias in (self.logit_bias or {}).items():
            if not 0 <= token < vocab_size:
                last = vocab_size - 1
                yield "logit_bias", f"logit_bias token {token} is not in the vocabulary (0-{last})"
            if not math.isfinite(bias):
                yield "logit_bias", f"logit_bias for token {token} must be a finite number"


class TokenConstraint(Protocol):
    """A compiled structured-output constraint (engine/constraints.py): one fresh
    logits processor per request, masking that request's row only."""

    def make_processor(self) -> Callable[[Any, Any], Any]: ...


@dataclass(frozen=True)
class TokenLogprob:
    """One token's log-probability and the most likely alternatives at its position."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # (token, logprob), most likely first


class SharedPrefill:
    """Sequences that share one prompt and one prefill (OpenAI `n`, prompt scoring).

    Made on the asyncio side and handed to every member's GenerationRequest; only the
    engine thread reads or writes the fields below the constructor's.
    """

    def __init__(self, members: int) -> None:
        self.members = members
        self.cache: Any = None  # KV cache of prompt[:-1], copied for each member
        self.prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None
        self.started = 0  # members the engine has taken


@dataclass(frozen=True)
class GenerationRequest:
    request_id: str
    prompt_tokens: list[int]
    max_tokens: int  # 0 only with prompt_logprobs: score the prompt, generate nothing
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: tuple[str, ...] = ()
    arrived_at: float = field(default_factory=time.monotonic)
    # time.monotonic() by which the request must be done; past it, TimeoutError.
    deadline: float | None = None
    constraint: TokenConstraint | None = None
    # Log-probabilities of generated tokens with this many alternatives (None: off).
    logprobs: int | None = None
    # True: of the model's own distribution, before logits processors and temperature.
    logprobs_raw: bool = False
    # Log-probabilities of the prompt's tokens (echo), with this many alternatives.
    prompt_logprobs: int | None = None
    shared: SharedPrefill | None = None
    # The LoRA adapter's tag (engine/adapters.py) this request runs under; None: the base.
    adapter: str | None = None
    # A prompt with images: its tiles, whose placeholder ids the prompt tokens hold.
    vision: ImageTiles | None = None
    # False: never drafts, even on a model with `speculative` on (the request's opt-out);
    # "ngram" or "draft": drafts by that method (a model with a draft may look up).
    speculative: bool | Literal["ngram", "draft"] = True
    # OpenAI's Predicted Outputs: text the reply is expected to repeat, as token ids;
    # prompt lookup proposes from it (docs/speculative.md).
    prediction: tuple[int, ...] = ()
    # True: the model's end-of-sequence tokens do not end the reply (it runs to
    # max_tokens, a stop string or the context); they are counted, never shown.
    ignore_eos: bool = False

    @property
    def speculative_method(self) -> str | None:
        """The method this request asked for by name (None: the model's)."""
        return self.speculative if isinstance(self.speculative, str) else None


# Events the engine thread posts to a request's queue (token ids, not text: the
# detokenizer runs on the asyncio side, off the engine thread).


@dataclass(frozen=True)
class PromptProcessed:
    """Prefill is done; the first token follows."""

    at: float
    cached_tokens: int = 0
    started_at: float | None = None  # when the engine began this prompt (queue time ends)
    # One entry per prompt token (the first is None: nothing precedes it), when asked.
    prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None


@dataclass(frozen=True)
class TokensGenerated:
    tokens: list[int]
    logprobs: tuple[TokenLogprob, ...] = ()  # one per token, when the request asked
    # A request with a prediction: its (proposed, accepted) tokens so far.
    predicted: tuple[int, int] | None = None


@dataclass(frozen=True)
class SequenceFinished:
    reason: FinishReason
    message: str = ""
    # With reason ERROR: the request itself was at fault (the API answers 400, not 500).
    refused: bool = False
    cache_stored: int = 0  # prompt tokens this sequence newly wrote into the prefix cache


EngineEvent = PromptProcessed | TokensGenerated | SequenceFinished


# Events the output stream hands to the protocol adapters.


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0  # prompt tokens the prefix cache supplied (not recomputed)
    cache_write_tokens: int = 0  # prompt tokens newly stored in the prefix cache
    # With a prediction: its tokens proposed and, of them, accepted (in the reply).
    predicted: tuple[int, int] | None = None

    @property
    def uncached_tokens(self) -> int:
        """The prompt tokens neither read from nor written to the cache (Anthropic's
        `input_tokens`: with the other two it adds up to the prompt)."""
        return self.prompt_tokens - self.cached_tokens - self.cache_write_tokens

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class TextDelta:
    text: str
    # The generated tokens behind this text, when the request asked for logprobs (the
    # text of a token may come out in a later delta when it ends mid-character).
    logprobs: tuple[TokenLogprob, ...] = ()
    # Only on an empty first delta, for requests that asked to score their prompt.
    prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None


@dataclass(frozen=True)
class Finished:
    reason: FinishReason
    usage: Usage
    stop_sequence: str | None = None
    message: str = ""
    refused: bool = False  # see SequenceFinished.refused


class EngineError(Exception):
    """A request the engine cannot take (bad input); the API maps it to a 400."""


class ContextLengthError(EngineError):
    pass


class EngineUnavailableError(Exception):
    """The engine is stopped or stopping; the API maps it to a 503."""


class GenerationFailedError(Exception):
    """The engine failed while generating this request; the API maps it to a 500."""


def raise_for_failure(reason: FinishReason, message: str, refused: bool) -> None:
    """A generation that ended in an error or an abort is an error, never a normal stop."""
    if reason is FinishReason.ERROR:
        if refused:
            raise EngineError(message or "the engine refused the request")
        raise GenerationFailedError(message or "generation failed")
    if reason is FinishReason.ABORT:
        raise EngineUnavailableError(message or "generation was aborted")
