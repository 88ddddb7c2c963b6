"""What one HTTP request spent, filled in while it runs.

The edge middleware opens a RequestUsage for every request before routing; the handler
runs in a copy of that context and so sees the same object. The code that resolves a
model names it here, each engine run adds its tokens (a Responses turn with tool calls
runs several), and the middleware hands the total to the ledger when the response ends.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass


@dataclass
class RequestUsage:
    model: str = ""  # the served model's name ("" for routes that name none)
    prompt_tokens: int = 0
    cached_tokens: int = 0  # of prompt_tokens, those the prefix cache supplied
    completion_tokens: int = 0
    generation_seconds: float = 0.0  # engine time: from prefill start to the last token

    @property
    def tokens(self) -> int:
        """What quotas and token rate limits count: prompt + completion."""
        return self.prompt_tokens + self.completion_tokens


current_usage: contextvars.ContextVar[RequestUsage | None] = contextvars.ContextVar(
    "vllm_mlx_usage", default=None
)


def note_usage_model(name: str) -> None:
    usage = current_usage.get()
    if usage is not None:
        usage.model = name


def add_usage(prompt: int, cached: int, completion: int, seconds: float) -> None:
    usage = current_usage.get()
    if usage is not None:
        usage.prompt_tokens += prompt
        usage.cached_tokens += cached
        usage.completion_tokens += completion
        usage.generation_seconds += seconds
