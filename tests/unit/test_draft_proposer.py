"""The draft model's proposals (engine/speculative/draft.py) on a tiny random llama: they
are its greedy continuation of each row's sequence, read in paced chunks, kept in step
as rows move on, join and leave."""

from __future__ import annotations

import random

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from tests.support.tiny_model import tiny_llama
from vllm_mlx.engine.speculative.draft import PROMPT_CHUNK, DraftModel


def greedy(model: object, tokens: list[int], n: int) -> list[int]:
    """The model's greedy continuation, one sequence, token by token. Each choice is
    decisive (its top two logits far apart against float32 rounding), so the batched
    draft, whose sums may run in another order, must choose the same."""
    cache = make_prompt_cache(model)
    logits = model(mx.array(tokens)[None], cache=cache)  # type: ignore[operator]
    out: list[int] = []
    for _ in range(n):
        top = mx.sort(logits[0, -1])[-2:].tolist()
        assert top[1] - top[0] > 1e-3, "a near tie: choose another seed"
        token = int(mx.argmax(logits[0, -1]).item())
        out.append(token)
        logits = model(mx.array([[token]]), cache=cache)  # type: ignore[operator]
    return out


def test_proposals_are_the_drafts_greedy_continuation_read_in_paced_chunks() -> None:
    model = tiny_llama()
    rng = random.Random(3)
    long = [rng.randrange(97) for _ in range(PROMPT_CHUNK * 2 + 40)]
    short = [rng.randrange(97) for _ in range(30)]
    draft = DraftModel(model)
    # Row 1's prompt takes three steps to read (paced): no proposal for it until then.
    rows = {1: (long[:-1], long[-1]), 2: (short[:-1], short[-1])}
    first = draft.propose(rows, {1: 3, 2: 3})
    assert 1 not in first  # 256 of its tokens read: not caught up
    assert 2 not in first  # the budget went to row 1 first
    assert draft.propose(rows, {1: 3, 2: 3}) == {}
    third = draft.propose(rows, {1: 3, 2: 3})
    assert third[1] == greedy(model, long, 3)
    # Row 2 reads once the budget allows; then it too proposes its continuation.
    fourth = draft.propose(rows, {1: 3, 2: 3})
    assert fourth[1] == greedy(model, long, 3) and fourth[2] == greedy(model, short, 3)
    # The rows move on (row 1 accepted two drafted tokens and a new one), row 2 leaves.
    moved = [*long, *third[1][:2], 5]
    after = draft.propose({1: (moved[:-1], moved[-1])}, {1: 4})
    assert after == {1: greedy(model, moved, 4)}
