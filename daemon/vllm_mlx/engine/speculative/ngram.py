"""Prompt lookup: propose the tokens that followed the latest earlier occurrence of the
sequence's last n tokens (prompt and reply alike), longest n first.

The index is kept incrementally: each appended token adds one entry per n, so a step
costs a few dictionary operations whatever the length of the sequence (a linear search
over a 3,000-token prompt every step would cost more than the step saves).
"""

from __future__ import annotations

from collections.abc import Sequence

from vllm_mlx.engine.speculative.config import SpeculativeConfig


class NgramProposer:
    """One sequence's n-gram index, fed every token of the sequence in order.

    `reference`: tokens indexed before the sequence, which the sequence is expected to
    repeat (a request's prediction, after its prompt's last tokens: the prompt's tail
    then matches there first, and the prediction's start is proposed as the reply's).
    Later occurrences win, so the sequence's own text takes over where it matches."""

    def __init__(
        self, config: SpeculativeConfig, tokens: Sequence[int] = (), reference: Sequence[int] = ()
    ) -> None:
        self._min = config.ngram_min
        self._max = config.ngram_max
        self.tokens: list[int] = []
        # Per n: n-gram -> the end (exclusive) of its latest occurrence so far.
        self._latest: dict[int, dict[tuple[int, ...], int]] = {
            n: {} for n in range(self._min, self._max + 1)
        }
        # Per n: where the previous occurrence of the current last n tokens ended, i.e.
        # where the continuation to propose starts (None: the tail is new).
        self._match: dict[int, int | None] = dict.fromkeys(self._latest)
        self.extend(reference)
        self._base = len(self.tokens)  # where the sequence starts in `tokens`
        self.extend(tokens)

    def __len__(self) -> int:
        """The sequence's tokens indexed (the reference not counted)."""
        return len(self.tokens) - self._base

    def extend(self, tokens: Sequence[int]) -> None:
        for token in tokens:
            self.append(token)

    def append(self, token: int) -> None:
        self.tokens.append(int(token))
        end = len(self.tokens)
        for n, table in self._latest.items():
            if n > end:
                break
            key = tuple(self.tokens[end - n :])
            self._match[n] = table.get(key)
            table[key] = end

    def catch_up(self, tokens: Sequence[int]) -> None:
        """Append what `tokens` (the sequence's own record) has beyond what is indexed."""
        if len(tokens) > len(self):
            self.extend(tokens[len(self) :])

    def has_match(self) -> bool:
        """Whether the current tail occurred before (a proposal is likely next step)."""
        return any(start is not None for start in self._match.values())

    def propose(self, limit: int) -> list[int]:
        """Up to `limit` tokens that followed the longest earlier match of the tail."""
        if limit < 1:
            return []
        for n in range(self._max, self._min - 1, -1):
            start = self._match.get(n)
            if start is not None:
                return self.tokens[start : start + limit]
        return []
