"""One decode step of the batch with prompt-lookup drafts checked by the target model.

A step normally feeds each row's pending token (sampled last step) and samples the next.
When some opted-in rows have proposals, this step instead feeds every row its pending
token followed by its proposal (rows without one: the pending token and filler), in one
forward pass. Position 0 of every row is exactly the normal step (same logits, the same
logits processors and sampler, so rows that do not speculate are unchanged). A
speculating row then draws at each later position the token decoding would have drawn
there (draws.py: greedy or sampled, with its processors and its own random stream), and
accepts its proposal up to the first token that differs from the draw; the draw there
becomes its next pending token. Logits are those of decoding (attention.py), so greedy
output is token for token decoding's, and sampled output follows the same distribution
(the same tokens for a seeded request where the logits are the same bits).

Stops and `max_tokens` are applied token by token over the accepted run, and a row's
KV cache keeps exactly the positions of the tokens it emitted (rewind.py), so a
finished row hands the prefix cache the same tokens and K/V as without speculation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import mlx.core as mx
import structlog
from mlx_lm.models.cache import KVCache, make_prompt_cache

from vllm_mlx.engine.logprobs import RawCapture
from vllm_mlx.engine.sampling import make_processors
from vllm_mlx.engine.speculative.attention import decode_equivalent_attention
from vllm_mlx.engine.speculative.config import SpeculativeConfig
from vllm_mlx.engine.speculative.draft import DraftModel, RowSequence
from vllm_mlx.engine.speculative.draws import (
    RowDraws,
    decodes_like_a_step,
    draw_until_rejected,
    failed,
)
from vllm_mlx.engine.speculative.emit import apply_stops, responses
from vllm_mlx.engine.speculative.ngram import NgramProposer
from vllm_mlx.engine.speculative.plan import choose_width
from vllm_mlx.engine.speculative.rewind import can_rewind, rewind
from vllm_mlx.engine.types import GenerationRequest
from vllm_mlx.models.cpu.vocab import log_probabilities

log = structlog.get_logger(__name__)

# A row's acceptance estimate starts here, and drifts back towards it by this fraction
# each step the plan declines its proposal: a row whose estimate fell (text that did not
# repeat) is checked again some tens of steps later, when the text may have changed
# (an answer that starts free and then quotes code). A probe that fails lowers the
# estimate again and lengthens the row's pause, so a bad proposer costs about one pass
# per 30-60 steps (docs/speculative.md).
PRIOR_RATE = 0.6
RECOVERY = 0.02

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
    """Rows that may speculate: greedy or sampled with the request's own sampler, with no
    logits processors but those its sampling parameters make (penalties and logit_bias:
    functions of the history alone, so draws.py can run them ahead), its grammar's mask
    and the raw-logprobs capture; the base model, text only.

    A grammar's mask keeps a parser's state, advanced by the last token of the history
    it is handed; draws.py hands it each position's history in order, so it checks
    drafted token j - 1 as it masks position j, exactly as decoding would after that
    token. A drafted token the grammar forbids is masked out at its position: the draw
    there differs from it, it is rejected, and the parser never consumes it."""
    own = len(make_processors(request.sampling, request.max_tokens))
    own += request.constraint is not None
    own += any(isinstance(p, RawCapture) for p in processors)
    return (
        decodes_like_a_step(sampler)
        and len(processors) == own
        and request.adapter is None
        and request.vision is None
        and request.speculative is not False
    )


@dataclass
class _Row:
    """One speculating row: its index, and how much it drafts now. A verify pass costs
    more per extra position than a decode step (about 8 ms a position for the bundled
    model on 2 CPU cores against ~37 ms a step), so a row whose proposals keep failing
    proposes fewer tokens, then pauses, instead of paying for tokens that are rejected."""

    proposer: NgramProposer | None  # None: the draft model proposes
    limit: int
    rate: float = PRIOR_RATE  # recent fraction of its proposed tokens accepted
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

    def declined(self) -> None:
        """The plan took no pass for this row's proposal: its estimate drifts back."""
        self.rate += (PRIOR_RATE - self.rate) * RECOVERY


class Speculator:
    """Proposals (prompt lookup, or a draft model's) for the rows registered with `add`,
    checked by the decode batch."""

    def __init__(
        self,
        config: SpeculativeConfig,
        counters: Counters,
        max_positions: int = MAX_VERIFY_POSITIONS,
        draft: DraftModel | None = None,
        draft_cost: float = 0.0,
        method: str | None = "",
    ) -> None:
        self.config = config
        # The model's method for rows that name none (None: such rows do not speculate).
        self.method = config.method if method == "" else method
        self.counters = counters
        self.max_positions = max_positions
        self.draft = draft
        self.draft_cost = draft_cost
        # uid -> its state, built when the row first reaches the decode batch.
        self._rows: dict[int, _Row | None] = {}
        self._methods: dict[int, str] = {}  # uid -> ngram or draft
        self._references: dict[int, tuple[int, ...]] = {}  # uid -> its lookup's reference

    def add(self, uid: int, method: str | None = None, reference: Sequence[int] = ()) -> None:
        """Speculate for row `uid` with `method` (None: the model's). A row may ask for
        prompt lookup on a model with a draft; one asking for a draft the model does not
        have looks up (the API refuses such a request first). `reference`: tokens its
        lookup indexes before its sequence (a prediction, after the prompt's tail)."""
        method = method or self.config.method
        self._methods[uid] = "draft" if method == "draft" and self.draft else "ngram"
        if reference:
            self._references[uid] = tuple(reference)
        self._rows[uid] = None

    def forget(self, uid: int) -> None:
        self._rows.pop(uid, None)
        self._methods.pop(uid, None)
        self._references.pop(uid, None)
        if not self._rows and self.draft is not None:
            self.draft.clear()  # its cache's rows all finished

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
        drafting = any(row.proposer is None for _, row in candidates)
        plan = self._plan(len(batch.uids), hoped, drafting)
        if plan < 1 or not can_rewind(batch.prompt_cache):
            return self._declined(candidates)
        mx.eval(batch._next_tokens)
        pending: list[int] = batch._next_tokens.tolist()
        wanted = {
            i: min(width, row.limit, batch.max_tokens[i] - batch._num_tokens[i] - 1)
            for i, row in candidates
        }
        rows = dict(candidates)
        drafts = self._looked_up(pending, candidates, wanted)
        if drafting and self.draft is not None:
            drafted = {i: n for i, n in wanted.items() if rows[i].proposer is None}
            drafts |= self._drafted(batch, pending, drafted, self.draft)
        proposals = [(len(d), rows[i].rate) for i, d in drafts.items()]
        width = self._plan(len(batch.uids), proposals, drafting)
        if width < 1:
            return self._declined(candidates)
        drafts = {i: d[:width] for i, d in drafts.items()}
        return self._verify(batch, pending, drafts, rows)

    @staticmethod
    def _declined(candidates: list[tuple[int, _Row]]) -> None:
        for _, row in candidates:
            row.declined()

    def _looked_up(
        self, pending: list[int], candidates: list[tuple[int, _Row]], wanted: dict[int, int]
    ) -> dict[int, list[int]]:
        drafts = {}
        for i, row in candidates:
            if row.proposer is None:
                continue  # the draft model proposes for it
            row.proposer.append(pending[i])  # emitted this step, whichever step runs
            proposal = row.proposer.propose(wanted[i])
            if proposal:
                drafts[i] = proposal
        return drafts

    def _drafted(
        self, batch: Any, pending: list[int], wanted: dict[int, int], draft: DraftModel
    ) -> dict[int, list[int]]:
        """The draft's proposals for the candidates in `wanted`; every row of the batch
        that drafts (paused ones too) is kept in the draft's cache, in step with its
        sequence."""
        sequences: dict[int, RowSequence] = {}
        for i, uid in enumerate(batch.uids):
            row = self._rows.get(uid)
            if row is not None and row.proposer is None:
                sequences[uid] = (batch.tokens[i], pending[i])
        uids = batch.uids
        try:
            proposed = draft.propose(sequences, {uids[i]: n for i, n in wanted.items()})
        except Exception:
            # The draft only proposes: if it fails (memory, a bug), the batch takes this
            # step without its proposals and the draft starts over from the prompts.
            log.exception("the draft model failed; this step takes no draft")
            draft.clear()
            return {}
        return {i: proposed[uids[i]] for i in wanted if proposed.get(uids[i])}

    def _plan(self, rows: int, proposals: list[tuple[int, float]], drafting: bool) -> int:
        config = self.config
        cost = self.draft_cost if drafting else 0.0
        return choose_width(rows, proposals, config.position_cost, config.row_cost, cost)

    def _candidates(self, batch: Any) -> list[tuple[int, _Row]]:
        out = []
        for i, uid in enumerate(batch.uids):
            if uid not in self._rows:
                continue
            row = self._rows[uid]
            if row is None:
                proposer = None
                if self._methods[uid] == "ngram":
                    reference = self._references.pop(uid, ())
                    proposer = NgramProposer(self.config, batch.tokens[i], reference)
                row = self._rows[uid] = _Row(proposer, self.config.num_tokens)
            elif row.proposer is not None:
                row.proposer.catch_up(batch.tokens[i])
            if failed(batch.samplers[i]):
                continue  # its sampling failed: the scheduler ends it after this step
            if row.pause:
                row.pause -= 1
            elif row.proposer is None or row.proposer.has_match():
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
        logprobs = log_probabilities(first)
        sampled = batch._sample(first, logprobs)
        ahead = {i: RowDraws(batch, i, logits[i], d) for i, d in drafts.items()}
        mx.eval(sampled, context)
        chosen: list[int] = sampled.tolist()
        drawn = draw_until_rejected(ahead, chosen)
        positions: list[list[mx.array]] = [[v] for v in logprobs]
        emitted, upcoming = [], []
        for i, p in enumerate(pending):
            if i not in drawn:
                emitted.append([p])
                upcoming.append(chosen[i])
                continue
            # x_0..x_{n-1} equal the proposal's first n tokens; x_n is the next token.
            n = len(drawn[i]) - 1
            emitted.append([p, *drafts[i][:n]])
            upcoming.append(drawn[i][n])
            positions[i].extend(ahead[i].vectors[:n])
            ahead[i].commit(n)
            rows[i].update(len(drafts[i]), n, self.config.num_tokens)
        finish = [apply_stops(batch, i, tokens) for i, tokens in enumerate(emitted)]
        self._count({i: drafts[i] for i in drawn}, emitted, rows)
        rewind(batch.prompt_cache, width, [len(tokens) for tokens in emitted])
        for record, tokens in zip(batch.tokens, emitted, strict=True):
            record.extend(tokens)
        batch._next_tokens = mx.array(upcoming, dtype=inputs.dtype)
        # Each row's next token was drawn at the position after its last emitted one.
        batch._next_logprobs = [positions[i][len(t) - 1] for i, t in enumerate(emitted)]
        current = batch._current_logprobs
        return responses(batch, emitted, finish, current, positions)

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
