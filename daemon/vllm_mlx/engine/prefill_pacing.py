"""Prefill chunks sized to what the running streams can wait for.

mlx-lm's BatchGenerator interleaves prefill with decoding: each step decodes one token
for every running sequence, then runs one chunk of every waiting prompt. With a fixed
chunk (`engine.prefill_step_size`, 512 tokens) one chunk costs 2-4 s on a 2-core CPU,
where a decode step of 8 rows costs ~60 ms: every stream stalls for seconds, once per
chunk, while a long prompt is read (docs/benchmarks.md).

The chunk is sized by time instead: while sequences are decoding, each step's chunk is
sized to take about `max_stall` decode steps, from the measured cost of a decode step
(the median of the latest few, so that a rare slow step does not widen the budget) and
of a prompt token (a moving average); both follow the batch size, the streams' own
growing contexts and the attention cost that grows with the prompt's offset. The
streams' gap between tokens stays within about (1 + max_stall) times their current
one; the prompt gets max_stall / (1 + max_stall) of the time. With nothing decoding the
chunk is the full `prefill_step_size`: a lone prompt's time to first token is unchanged.

Both costs are measured apart in every paced step: the generator finishes the step's
decode computation before the chunk starts (engine/batch_generator.py), where mlx-lm
would let the next decode step compute under the chunk's. Before, the decode cost was
known only from steps without a chunk, so while a long prompt was read the streams'
growth was charged to the prompt's tokens: their cost seemed to grow, and the chunks
shrank below the budget. In-process, 8 streams and a 4k prompt at `max_stall: 3.0`:
394 steps of mostly 4-8 tokens, a step's median 109 ms where 4 decode steps were ~160,
the prompt's first token after 44.9 s; measured apart, 219 steps of 12-32 tokens, 143 ms,
32.8 s (docs/benchmarks.md, round 22; over HTTP the first token came no sooner, 38-39 s
against 40-44 s: larger chunks at a long offset cost about as much a token).

A token's cost is the chunk's time over its tokens, so a chunk's fixed part (the
weights read once more, attention over every earlier key) is spread over them. Sizing
by it still settles where a chunk takes max_stall decode steps: after a chunk of k
tokens cost a + b*k, the next is sized k' = budget * k / (a + b*k), whose fixed point
a + b*k = budget is stable (each step's error shrinks by a / budget); the ladder's floor
stops the approach up to one ladder step short of it.

Chunk sizes come from a short ladder (multiples of 4 below 32, then powers of two) so
that a prompt is cut in few distinct ways whatever the timing noise; a distributed group
(every rank must cut alike) does not pace.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

SMALLEST_CHUNK = 4  # at a 4k offset one token costs ~10 ms here: 16 were 3x a decode step
_SMOOTHING = 0.3  # weight of the newest measurement in the token cost's moving average
# The decode step's cost is the median of this many latest steps. A moving average took
# a rare slow step (a collection, the host) as a larger budget, and the next chunks were
# sized to it: at `max_prefill_stall: 1.0` the streams' p99 while a 4k prompt was read
# rose from ~130 to ~150-200 ms over HTTP (docs/benchmarks.md, round 22).
STEP_WINDOW = 9


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
    step_seconds: float | None = None  # a decode step's own cost, median of recent ones
    token_seconds: float | None = None  # one prompt token's share of a step, moving average
    _steps: deque[float] = field(default_factory=lambda: deque(maxlen=STEP_WINDOW), repr=False)

    def chunk(self, decoding: bool, prompts: int) -> int:
        """Tokens of each waiting prompt to process in the coming step."""
        if not decoding or prompts <= 0:
            return self.step_size
        if self.step_seconds is None or self.token_seconds is None:
            return min(SMALLEST_CHUNK, self.step_size)  # measure before spending more
        budget = self.max_stall * self.step_seconds / self.token_seconds / prompts
        return _ladder_floor(budget, self.step_size)

    def observe(self, seconds: float, prompt_tokens: int, decode_seconds: float | None) -> None:
        """One step's wall time, the prompt tokens it processed, and its decode step's own
        time (None: it decoded nothing)."""
        if seconds <= 0:
            return
        if decode_seconds is not None and decode_seconds > 0:
            self._steps.append(decode_seconds)
            self.step_seconds = statistics.median(self._steps)
        if prompt_tokens > 0:
            # Never below a tenth of the step: a token is never free, whatever the timer.
            spent = max(seconds - (decode_seconds or 0.0), seconds / 10)
            self.token_seconds = _average(self.token_seconds, spent / prompt_tokens)

    def describe(self) -> dict[str, float | None]:
        return {
            "decode_step_seconds": self.step_seconds,
            "prompt_token_seconds": self.token_seconds,
        }
