"""What the speculative-decoding engine tests share: 16 prompts (most with replies that
repeat their input, some open-ended), greedy requests, and running them in groups."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from vllm_mlx.engine.engine import Engine
from vllm_mlx.engine.types import (
    GenerationRequest,
    SamplingParams,
    SequenceFinished,
    TokensGenerated,
)

CODE = "def area(w, h):\n    return w * h\n\ndef total(items):\n    return sum(items)\n"
SUBJECTS = [
    "apples", "rivers", "planets", "violins", "castles",
    "lanterns", "bridges", "meadows", "comets", "harbors",
]  # fmt: skip
TEMPLATES = [
    "Repeat this text exactly: the {s} are red, the {s} are blue, the {s} are here.",
    "Copy this code and rename area to {s}_area:\n" + CODE,
    "Write the list '{s} 1, {s} 2, {s} 3' and continue it to {s} 9.",
    "Quote this line three times: I like {s} and {s} like me.",
    "Tell me one fact about {s}.",
]
# 16 prompts: one full batch of 16, each kind three or four times; alone, every other one
# still takes each kind. All 50 cost ~2 min more of CI on a 2-core CPU, 32 ~1 min, and
# neither took a path these do not.
PROMPTS = [t.format(s=s) for s in SUBJECTS for t in TEMPLATES][:16]
MAX_TOKENS = 20


def chat(engine: Engine, text: str) -> list[int]:
    messages = [{"role": "user", "content": text}]
    return list(engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True))


async def tokens_of(engine: Engine, request: GenerationRequest) -> tuple[list[int], str, int]:
    """(generated ids, finish reason, prompt tokens the finished sequence stored)."""
    out: list[int] = []
    async for event in engine.events(request):
        if isinstance(event, TokensGenerated):
            out.extend(event.tokens)
        elif isinstance(event, SequenceFinished):
            return out, event.reason.value, event.cache_stored
    raise AssertionError("no SequenceFinished")


Runner = Callable[[Engine, GenerationRequest], Awaitable[Any]]


def in_groups(
    engine: Engine, requests: Sequence[GenerationRequest], size: int, run: Runner = tokens_of
) -> list[Any]:
    """Each group of `size` requests submitted together, groups one after another; each
    request's `run(engine, request)` result, in order."""

    async def main() -> list[Any]:
        out: list[Any] = []
        for start in range(0, len(requests), size):
            group = requests[start : start + size]
            out += await asyncio.gather(*(run(engine, r) for r in group))
        return out

    return asyncio.run(main())


def greedy(engine: Engine, texts: Sequence[str], max_tokens: int = MAX_TOKENS) -> list[Any]:
    return [
        GenerationRequest(f"g{i}", chat(engine, t), max_tokens, SamplingParams())
        for i, t in enumerate(texts)
    ]


_REFERENCE: dict[tuple[str, int], list[Any]] = {}


def reference(engine: Engine, max_tokens: int = MAX_TOKENS) -> list[Any]:
    """Every prompt decoded greedily without speculation, 8 at a time. Computed once per
    test process: the engine fixture (tests/engine/conftest.py) is per module, but every
    module loads the same model the same way, and its greedy output is the model's."""
    key = (engine.loaded.directory, max_tokens)
    if key not in _REFERENCE:
        _REFERENCE[key] = in_groups(engine, greedy(engine, PROMPTS, max_tokens), 8)
    return _REFERENCE[key]
