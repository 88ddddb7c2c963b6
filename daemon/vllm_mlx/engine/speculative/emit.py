"""What a verify pass hands the scheduler: each row's emitted tokens, cut at a stop or
`max_tokens` exactly where decoding would stop, as one response per token."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx


def apply_stops(batch: Any, i: int, tokens: list[int]) -> str | None:
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


def responses(
    batch: Any,
    emitted: list[list[int]],
    finish: list[str | None],
    current: list[mx.array],
    positions: Sequence[Sequence[mx.array]],
) -> list[Any]:
    """One response per emitted token, in order; finished rows leave the batch.

    Token 0 of a row is its pending token, drawn from `current[i]` (last step's
    log-probabilities); token j > 0 is draft j - 1, drawn at position j - 1 of the pass,
    whose log-probabilities are `positions[i][j - 1]` (lazy: read only if asked for).
    """
    out, keep = [], []
    for i, tokens in enumerate(emitted):
        uid = batch.uids[i]
        for j, token in enumerate(tokens):
            logprobs = current[i] if j == 0 else positions[i][j - 1]
            reason = finish[i] if j == len(tokens) - 1 else None
            if reason is None:
                out.append(batch.Response(uid, token, logprobs, None, None, None))
            else:
                cache = batch.extract_cache(i)
                out.append(batch.Response(uid, token, logprobs, reason, cache, batch.tokens[i]))
        if finish[i] is None:
            keep.append(i)
    if len(keep) < len(batch.uids):
        batch.filter(keep)
    return out
