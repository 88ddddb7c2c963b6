"""Image requests on the engine thread: their tiles encoded, then prefilled like text.

A request with images waits here until the engine loop takes it: one such request per
loop iteration, between decode steps, so a burst of image requests never holds the
running batch for more than one request's vision encode. Its tiles go through the
tower (only those the prefix cache does not already cover: a repeated image costs no
encode), their features go into the text model's placeholder table, and the request
then joins the batch as any other: its prefill runs in mlx-lm's chunks beside the
other rows, reading the features where its prompt holds placeholder ids.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

from vllm_mlx.engine.scheduler_state import AddCommand
from vllm_mlx.engine.types import GenerationRequest
from vllm_mlx.models.vision import VisionTower

EncodeHook = Callable[[float, int], None]  # (seconds, tiles encoded)


class VisionStage:
    def __init__(self, tower: VisionTower) -> None:
        self.tower = tower
        self.waiting: deque[AddCommand] = deque()
        self.on_encode: EncodeHook | None = None

    def refusal(self, request: GenerationRequest, vocab_size: int) -> str | None:
        """Why the engine will not run this image request (the API checks first)."""
        tiles = request.vision
        assert tiles is not None
        if request.prompt_logprobs is not None:
            return "prompt logprobs are not available for prompts with images"
        positions = set(tiles.placeholder_positions())
        tokens = request.prompt_tokens
        if not positions or max(positions) >= len(tokens) - 1:
            return "the prompt's image tokens must be followed by text"
        for i, token in enumerate(tokens):
            if (token >= vocab_size) != (i in positions) or token < 0:
                return "the prompt's image placeholders do not match its images"
        return None

    def defer(self, command: AddCommand) -> None:
        self.waiting.append(command)

    def take(self) -> AddCommand | None:
        return self.waiting.popleft() if self.waiting else None

    def withdraw(self, request_id: str) -> AddCommand | None:
        """The waiting command of this request, removed (an abort before its encode)."""
        for command in self.waiting:
            if command.request.request_id == request_id:
                self.waiting.remove(command)
                return command
        return None

    def encode(self, request: GenerationRequest, cached: int) -> None:
        """Features for the tiles whose tokens lie past the first `cached` prompt tokens."""
        tiles = request.vision
        assert tiles is not None
        spans = list(zip(tiles.starts, tiles.lengths, strict=True))
        needed = [t for t, (start, length) in enumerate(spans) if start + length > cached]
        if not needed:
            return
        import mlx.core as mx

        started = time.monotonic()
        masks = None if tiles.masks is None else tiles.masks[needed]
        count = sum(tiles.lengths[t] for t in needed)
        features = self.tower.encode(tiles.pixels[needed], masks, count)
        mx.eval(features)
        tokens = request.prompt_tokens
        ids = [tokens[spans[t][0] + k] for t in needed for k in range(spans[t][1])]
        self.tower.table.add(request.request_id, ids, features)
        if self.on_encode is not None:
            self.on_encode(time.monotonic() - started, len(needed))

    def release(self, request_id: str) -> None:
        self.tower.table.drop(request_id)

    def clear(self) -> None:
        self.tower.table.clear()

    def processors(self, processors: list[Any], vocab_size: int) -> list[Any]:
        """Each logits processor seeing the image token where the prompt holds a
        placeholder (penalties index the logits by the tokens of the context)."""
        image_token = self.tower.image_token_id

        def mapped(processor: Any) -> Any:
            def run(context: Any, logits: Any) -> Any:
                import mlx.core as mx

                safe = mx.where(context >= vocab_size, image_token, context)
                return processor(safe, logits)

            return run

        return [mapped(p) for p in processors]
