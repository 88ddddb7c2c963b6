"""One decode step of the batch with prompt-lookup drafts checked by the target model.

A step normally feeds each row's pending token (sampled last step) and samples the next.
When some opted-in rows have proposals, this step instead feeds every row its pending
token followed by its proposal (rows without one: the pending token and filler), in one
forward pass. Position 0 of every row is exactly the normal step (same logits, the same
logits processors and sampler, so rows that do not speculate are unchanged); a greedy
row then also accepts its proposal up to the first token the model would not have
chosen, and takes the model's own token there as its next pending token. Each accepted
token is the argmax of logits identical to decoding's (attention.py), so the output is
token for token what decoding without speculation gives.

Stops and `max_tokens` are applied token by token over the accepted run, and a row's
KV cache keeps exactly the positions of the tokens it emitted (rewind.py), so a
finished row hands the prefix cache the same tokens and K/V as without speculation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import mlx.core as mx
from mlx_lm.models.cache import KVCache, make_prompt_cache
from mlx_lm.sample_utils import greedy_sampler

from vllm_mlx.engine.speculative.attention import decode_equivalent_attention
from vllm_mlx.engine.speculative.config import SpeculativeConfig
from vllm_mlx.engine.speculative.ngram import NgramProposer
from vllm_mlx.engine.speculative.plan import choose_width
from vllm_mlx.engine.speculative.rewind import can_rewind, rewind
from vllm_mlx.engine.types import GenerationRequest

# Positions one verify pass may feed in all: the CPU kernel's batch-invariant limit
# (models/cpu/qmm.py MAX_ROWS). Past it, projections take another path whose sums differ.
MAX_VERIFY_POSITIONS = 128


class Counters(Protocol):
    drafted_tokens: int
    accepted_tokens: int
    speculative_steps: int
    drafts: int  # proposals checked (a row's proposal in one pass is one)
    accepted_per_position: list[int]  # [k]: proposals whose token k was accepted


def model_supports(model: Any) -> bool:
    """Plain KV layers only: the rewind moves positions of full-precision batch caches
    (sliding-window and state-space layers would need their own)."""
    return all(type(c) is KVCache for c in make_prompt_cache(model))


def eligible(request: GenerationRequest, sampler: Any, processors: Sequence[Any]) -> bool:
    """Rows this slice speculates for: greedy, nothing reshaping or reading the logits,
    the base model, text only. Every other row keeps the plain decode step."""
    return (
        sampler is greedy_sampler
        and not processors
        and request.logprobs is None
        and request.adapter is None
        and request.vision is None
        and request.speculative
    )


@dataclass
class _Row:
    """One speculating row: its index, and how much it drafts now. A verify pass costs
    more per extra position than a decode step (about 8 ms a position for the bundled
    model on 2 CPU cores against ~37 ms a step), so a row whose proposals keep failing
    proposes fewer tokens, then pauses, instead of paying for tokens that are rejected."""

    proposer: NgramProposer
    limit: int
    rate: float = 0.6  # recent fraction of its proposed tokens accepted
    misses: int = 0  # verify steps in a row that accepted nothing
    pause: int = 0  # steps left before it proposes again
    drafted: int = 0  # this request's proposed tokens so far (for /v1/status)
    accepted: int = 0  # and of them accepted

    def update(self, drafted: int, accepted: int, most: int) -> None:
        self.rate = 0.7 * self.rate + 0.3 * accepted / drafted
        if accepted == drafted:
            self.limit, self.misses = min(most, self.limit * 2), 0
        elif accepted:
            self.limit, self.misses = accepted + 1, 0
        else:
            self.limit, self.misses = max(1, self.limit // 2), self.misses + 1
            if self.misses >= 2:
                self.pause = min(2**self.misses, 64)


class Speculator:
    """Prompt lookup for the rows registered with `add`, run by the decode batch."""

    def __init__(
        self,
        config: SpeculativeConfig,
        counters: Counters,
        max_positions: int = MAX_VERIFY_POSITIONS,
    ) -> None:
        self.config = config
        self.counters = counters
        self.max_positions = max_positions
        # uid -> its state, built when the row first reaches the decode batch.
        self._rows: dict[int, _Row | None] = {}

    def add(self, uid: int) -> None:
        self._rows[uid] = None

    def forget(self, uid: int) -> None:
        self._rows.pop(uid, None)

    def acceptance(self, uid: int) -> tuple[int, int] | None:
        """A speculating request's (proposed, accepted) tokens so far; None for a request
        that does not speculate. Read from other threads: two plain ints."""
        if uid not in self._rows:
            return None
        row = self._rows.get(uid)
        return (0, 0) if row is None else (row.drafted, row.accepted)

    def step(self, batch: Any) -> list[Any] | None:
        """The batch's responses for a verify step, or None: take the normal step."""
        candidates = self._candidates(batch)
        if not candidates:
            return None
        width = min(self.config.num_tokens, self.max_positions // len(batch.uids) - 1)
        # Expected to pay off even if every candidate proposes its most? If not, the
        # plain (pipelined) step runs without waiting for this step's tokens.
        hoped = [(min(width, row.limit), row.rate) for _, row in candidates]
        if self._plan(len(batch.uids), hoped) < 1 or not can_rewind(batch.prompt_cache):
            return None
        mx.eval(batch._next_tokens)
        pending: list[int] = batch._next_tokens.tolist()
        drafts: dict[int, list[int]] = {}
        for i, row in candidates:
            row.proposer.append(pending[i])  # emitted this step, whichever step runs
            room = batch.max_tokens[i] - batch._num_tokens[i] - 1
            proposal = row.proposer.propose(min(width, room, row.limit))
            if proposal:
                drafts[i] = proposal
        rows = dict(candidates)
        width = self._plan(len(batch.uids), [(len(d), rows[i].rate) for i, d in drafts.items()])
        if width < 1:
            return None
        drafts = {i: d[:width] for i, d in drafts.items()}
        return self._verify(batch, pending, drafts, rows)

    def _plan(self, rows: int, proposals: list[tuple[int, float]]) -> int:
        config = self.config
        return choose_width(rows, proposals, config.position_cost, config.row_cost)

    def _candidates(self, batch: Any) -> list[tuple[int, _Row]]:
        out = []
        for i, uid in enumerate(batch.uids):
            if uid not in self._rows:
                continue
            row = self._rows[uid]
            if row is None:
                proposer = NgramProposer(self.config, batch.tokens[i])
                row = self._rows[uid] = _Row(proposer, self.config.num_tokens)
            else:
                row.proposer.catch_up(batch.tokens[i])
            if row.pause:
                row.pause -= 1
            elif row.proposer.has_match():
                out.append((i, row))
        return out

    def _verify(
        self,
        batch: Any,
        pending: list[int],
        drafts: dict[int, list[int]],
        rows: dict[int, _Row],
    ) -> list[Any]:
        width = 1 + max(len(d) for d in drafts.values())
        grid = [[p, *drafts.get(i, ())] for i, p in enumerate(pending)]
        grid = [row + [row[0]] * (width - len(row)) for row in grid]  # filler, never kept
        inputs = batch._next_tokens
        batch._current_tokens = inputs
        batch._current_logprobs = batch._next_logprobs
        with decode_equivalent_attention(batch.model):
            logits = batch.model(mx.array(grid, dtype=inputs.dtype), cache=batch.prompt_cache)
        # Position 0 is the normal step for every row: its processors and sampler.
        first, context = batch._process(inputs, logits[:, 0, :])
        logprobs = first - mx.logsumexp(first, axis=-1, keepdims=True)
        sampled = batch._sample(first, logprobs)
        targets = mx.argmax(logits, axis=-1)
        mx.eval(sampled, targets, context)
        chosen: list[int] = sampled.tolist()
        best: list[list[int]] = targets.tolist()  # type: ignore[assignment]
        emitted, upcoming, accepted_at = [], [], {}
        for i, p in enumerate(pending):
            proposal = drafts.get(i)
            if proposal is None:
                emitted.append([p])
                upcoming.append(chosen[i])
                continue
            n = 0
            while n < len(proposal) and proposal[n] == best[i][n]:
                n += 1
            emitted.append([p, *proposal[:n]])
            upcoming.append(best[i][n])
            accepted_at[i] = n
            rows[i].update(len(proposal), n, self.config.num_tokens)
        finish = [_apply_stops(batch, i, tokens) for i, tokens in enumerate(emitted)]
        self._count(drafts, emitted, rows)
        rewind(batch.prompt_cache, width, [len(tokens) for tokens in emitted])
        for record, tokens in zip(batch.tokens, emitted, strict=True):
            record.extend(tokens)
        batch._next_tokens = mx.array(upcoming, dtype=inputs.dtype)
        next_logprobs = list(logprobs)
        for i, n in accepted_at.items():
            next_logprobs[i] = _normalized(logits[i, n])
        current = batch._current_logprobs
        batch._next_logprobs = next_logprobs
        return _responses(batch, emitted, finish, current, logits)

    def _count(
        self, drafts: dict[int, list[int]], emitted: list[list[int]], rows: dict[int, _Row]
    ) -> None:
        """The engine's and each request's counters for one pass. A token counts as
        accepted when it was emitted: a stop inside an accepted run cuts the rest."""
        counters = self.counters
        counters.speculative_steps += 1
        counters.drafts += len(drafts)
        per_position = counters.accepted_per_position
        for i, proposal in drafts.items():
            accepted = len(emitted[i]) - 1
            counters.drafted_tokens += len(proposal)
            counters.accepted_tokens += accepted
            rows[i].drafted += len(proposal)
            rows[i].accepted += accepted
            if len(per_position) < len(proposal):
                per_position.extend([0] * (len(proposal) - len(per_position)))
            for position in range(accepted):
                per_position[position] += 1


def _apply_stops(batch: Any, i: int, tokens: list[int]) -> str | None:
    """Count and stop-match a row's emitted tokens in order, as the normal step does one
    a step; cut the run after the token that finishes the row."""
    for j, token in enumerate(tokens):
        reason = None
        batch._num_tokens[i] += 1
        if batch._num_tokens[i] >= batch.max_tokens[i]:
            reason = "length"
        if batch._matchers[i].advance(token):
            reason = "stop"
        if reason is not None:
            del tokens[j + 1 :]
            return reason
    return None


def _normalized(row: mx.array) -> mx.array:
    """Log-probabilities, lazily: evaluated only if a request reads them."""
    return row - mx.logsumexp(row, axis=-1, keepdims=True)


def _responses(
    batch: Any,
    emitted: list[list[int]],
    finish: list[str | None],
    current: list[mx.array],
    logits: mx.array,
) -> list[Any]:
    """One response per emitted token, in order; finished rows leave the batch."""
    responses, keep = [], []
    for i, tokens in enumerate(emitted):
        uid = batch.uids[i]
        for j, token in enumerate(tokens):
            # Token j > 0 is draft j - 1, which position j - 1 of the pass predicted.
            logprobs = current[i] if j == 0 else _normalized(logits[i, j - 1])
            reason = finish[i] if j == len(tokens) - 1 else None
            if reason is None:
                responses.append(batch.Response(uid, token, logprobs, None, None, None))
            else:
                cache = batch.extract_cache(i)
                responses.append(
                    batch.Response(uid, token, logprobs, reason, cache, batch.tokens[i])
                )
        if finish[i] is None:
            keep.append(i)
    if len(keep) < len(batch.uids):
        batch.filter(keep)
    return responses
