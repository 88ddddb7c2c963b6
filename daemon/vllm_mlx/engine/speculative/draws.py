"""The tokens decoding would draw at each position of a speculating row's verify pass.

A row's pass feeds its pending token and its proposal d_0..d_{k-1}; position j's logits
are the model's distribution for the token after d_{j-1}. For each position this draws
x_j exactly as a decode step would, had the proposal's tokens before j been emitted:
the row's logits processors see the history with those tokens appended, greedy rows take
the argmax, and sampled rows draw with the row's own sampler and the key its stream
would hand out for that token. Position 0 is the batch's ordinary step (verify.py); this
module does positions 1..k.

The row accepts d_j while x_j == d_j, and its next token is x_n at the first mismatch n
(or the bonus x_k). For a sampled row that is the speculative-sampling rule for a point
mass draft: d_j is accepted with probability p_j(d_j), and after a rejection x_j is
distributed as p_j with d_j removed and renormalized (the residual). Because the draws
are the same as decoding's, a seeded request emits the same tokens with and without
speculation wherever the logits are the same bits.

`commit` then leaves the row as decoding the emitted tokens would have: the sampler's
key advanced once per drawn token, the processors' history holding the accepted tokens,
and a raw-logprobs capture holding one entry per drawn token.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
from mlx_lm.sample_utils import greedy_sampler

from vllm_mlx.engine.logprobs import RawCapture
from vllm_mlx.engine.sampling import GuardedSampler, SeededSampler
from vllm_mlx.models.cpu.vocab import log_probabilities


def decodes_like_a_step(sampler: Any) -> bool:
    """Whether `sampler` is one whose draws this module reproduces: the shared greedy
    sampler, or a request's own seeded sampler (engine/sampling.py) behind its guard."""
    if sampler is greedy_sampler:
        return True
    return isinstance(sampler, GuardedSampler) and isinstance(sampler.sampler, SeededSampler)


def seeded(sampler: Any) -> SeededSampler | None:
    inner = sampler.sampler if isinstance(sampler, GuardedSampler) else None
    return inner if isinstance(inner, SeededSampler) else None


def failed(sampler: Any) -> bool:
    """Whether the row's sampling already failed (the scheduler fails it after this step)."""
    return isinstance(sampler, GuardedSampler) and sampler.fault.message is not None


def _processors(batch: Any, i: int) -> Sequence[Any]:
    return (batch.logits_processors[i] if batch.logits_processors else None) or ()


class RowDraws:
    """One speculating row's draws at positions 1..k of a pass, made one position at a
    time (`draw`), so a row whose proposal failed early pays for no later draw (a top-p
    draw sorts the vocabulary: ~7 ms on 2 CPU cores for 49k tokens)."""

    def __init__(self, batch: Any, i: int, logits: mx.array, draft: list[int]) -> None:
        """`logits`: the row's (positions, vocabulary) logits of the pass. Made after
        the batch sampled position 0 (the row's key has moved past that draw)."""
        self.batch, self.i, self.logits, self.draft = batch, i, logits, draft
        self.processors = _processors(batch, i)
        self.sampler = seeded(batch.samplers[i])
        self.history = batch._token_context[i].tokens if self.processors else None
        self.key = self.sampler.key if self.sampler is not None else None
        self.vectors: list[mx.array] = []  # [j - 1]: position j's log-probabilities
        self.keys: list[mx.array] = []  # [j - 1]: the sampler's key after drawing x_j
        self.raw: list[mx.array] = []  # [j - 1]: position j's logits for a raw capture
        self._greedy: mx.array | None = None

    def draw(self, j: int) -> mx.array:
        """x_j (lazy), drawn as decoding would after the proposal's first j tokens.
        Positions are drawn in order: 1, 2, ..."""
        assert j == len(self.vectors) + 1
        if not self.processors and self.sampler is None:  # plain greedy: one argmax
            if self._greedy is None:
                rows = self.logits[1 : len(self.draft) + 1]
                self._greedy = mx.argmax(rows, axis=-1)
            row = self.logits[j]
            self.vectors.append(log_probabilities(row))
            return self._greedy[j - 1 : j]
        row = self.logits[j : j + 1]
        if self.history is not None:
            drafted = mx.array(self.draft[:j], dtype=self.history.dtype)
            context = mx.concatenate([self.history, drafted])
            for processor in self.processors:
                if isinstance(processor, RawCapture):
                    # Kept for commit; the processors after it get a new array, as the
                    # capture hands them in a decode step (penalties assign into it).
                    self.raw.append(row)
                    row = mx.array(row)
                    continue
                row = processor(context, row)
        vector = log_probabilities(row)
        self.vectors.append(vector[0])
        if self.sampler is None or self.key is None:
            return mx.argmax(row, axis=-1)
        self.key, step_key = mx.random.split(self.key)
        self.keys.append(self.key)
        return self.sampler.draw(vector, step_key)

    def commit(self, accepted: int) -> None:
        """The row emitted x_0..x_{accepted-1} (its accepted drafts) and x_accepted is its
        next token: leave its sampler, history and capture as decoding would."""
        if accepted < 1:
            return
        if self.sampler is not None:
            self.sampler.key = self.keys[accepted - 1]
        if not self.processors:
            return
        context = self.batch._token_context[self.i]
        context.update_and_fetch(mx.array(self.draft[:accepted], dtype=mx.int32))
        for processor in self.processors:
            if isinstance(processor, RawCapture):
                for row in self.raw[:accepted]:
                    processor(context.tokens, row)


def draw_until_rejected(ahead: dict[int, RowDraws], first: Sequence[int]) -> dict[int, list[int]]:
    """Each row's draws x_0..x_n (x_0: `first[i]`, the batch's own sample): while the
    draws equal the row's proposal, the next, up to the first that differs or the bonus
    after the last proposed token. Rows drawn at the same depth are evaluated together.
    A row whose sampling fails here is failed alone (its guard's fault) and left out."""
    drawn = {i: [first[i]] for i in ahead}
    live = list(ahead)
    depth = 1
    while True:
        live = [i for i in live if drawn[i][-1] == ahead[i].draft[depth - 1]]
        tokens = {}
        for i in live:
            try:
                tokens[i] = ahead[i].draw(depth)
            except Exception as exc:
                fault = getattr(ahead[i].batch.samplers[i], "fault", None)
                if fault is None:
                    raise
                fault.record("speculative sampling", exc)
                del drawn[i]
        if not tokens:
            return drawn
        mx.eval(*tokens.values())
        for i, token in tokens.items():
            value: list[int] = token.tolist()  # type: ignore[assignment]
            drawn[i].append(value[0])
        live = [i for i in tokens if depth < len(ahead[i].draft)]
        depth += 1
