"""Prefill chunks sized to what the running streams can wait for.

mlx-lm's BatchGenerator interleaves prefill with decoding: each step decodes one token
for every running sequence, then runs one chunk of every waiting prompt. With a fixed
chunk (`engine.prefill_step_size`, 512 tokens) one chunk costs 2-4 s on a 2-core CPU,
where a decode step of 8 rows costs ~60 ms: every stream stalls for seconds, once per
chunk, while a long prompt is read (docs/benchmarks.md).

On a CPU prefill is compute-bound, so a small chunk costs about as much per token as a
large one, and the chunk can be sized by time instead: while sequences are decoding,
each step's chunk is sized to take about `max_stall` decode steps, from the measured
cost of a decode step and of a prompt token (moving averages, so they follow the batch
size and the attention cost that grows with the prompt's offset). The streams' gap
between tokens stays within about (1 + max_stall) times their usual one; the prompt
gets max_stall / (1 + max_stall) of the time. With nothing decoding the chunk is the
full `prefill_step_size`: a lone prompt's time to first token is unchanged.

Chunk sizes come from a short ladder (multiples of 4 below 32, then powers of two) so
that a prompt is cut in few distinct ways whatever the timing noise; a distributed group
(every rank must cut alike) does not pace.
"""

from __future__ import annotations

from dataclasses import dataclass

SMALLEST_CHUNK = 4  # at a 4k offset one token costs ~10 ms here: 16 were 3x a decode step
_SMOOTHING = 0.3  # weight of the newest measurement in the moving averages


def _ladder_floor(tokens: float, largest: int) -> int:
    """`largest` if `tokens` reach it, else the ladder's step at most `tokens`: multiples
    of SMALLEST_CHUNK below 32 (where the budget usually lands beside decoding, a whole
    power of two would waste up to half of it), powers of two above; never below
    SMALLEST_CHUNK, so every step makes progress."""
    if tokens >= largest:
        return largest
    if tokens < 32:
        return max(SMALLEST_CHUNK, int(tokens) // SMALLEST_CHUNK * SMALLEST_CHUNK)
    chunk = 32
    while chunk * 2 <= tokens:
        chunk *= 2
    return min(chunk, largest)


def _average(previous: float | None, value: float) -> float:
    return value if previous is None else previous + _SMOOTHING * (value - previous)


@dataclass
class PrefillPacer:
    step_size: int  # the chunk with nothing decoding (engine.prefill_step_size)
    max_stall: float  # a chunk beside decoding takes about this many decode steps
    step_seconds: float | None = None  # a decode step with no prefill, moving average
    token_seconds: float | None = None  # one prompt token's share of a step, moving average

    def chunk(self, decoding: bool, prompts: int) -> int:
        """Tokens of each waiting prompt to process in the coming step."""
        if not decoding or prompts <= 0:
            return self.step_size
        if self.step_seconds is None or self.token_seconds is None:
            return min(SMALLEST_CHUNK, self.step_size)  # measure before spending more
        budget = self.max_stall * self.step_seconds / self.token_seconds / prompts
        return _ladder_floor(budget, self.step_size)

    def observe(self, seconds: float, prompt_tokens: int, decoded: bool) -> None:
        """One step's wall time, the prompt tokens it processed, whether it decoded."""
        if seconds <= 0:
            return
        if prompt_tokens == 0:
            if decoded:
                self.step_seconds = _average(self.step_seconds, seconds)
            return
        spent = seconds
        if decoded and self.step_seconds is not None:
            # The decode step's share; never below a tenth, against a noisy average.
            spent = max(seconds - self.step_seconds, seconds / 10)
        self.token_seconds = _average(self.token_seconds, spent / prompt_tokens)

    def describe(self) -> dict[str, float | None]:
        return {
            "decode_step_seconds": self.step_seconds,
            "prompt_token_seconds": self.token_seconds,
        }
