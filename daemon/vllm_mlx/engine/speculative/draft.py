"""Proposals from a draft model: a small model with the target's tokenizer, run in the
engine thread beside the target, batched over the rows that speculate with it.

The draft keeps its own batch KV cache, one row per speculating request, in an order
of its own (rows join and leave as requests do; `sync`). Each row of that cache holds
a prefix of its request's sequence (prompt and emitted tokens). A proposal step:

1. **Catch up.** Every draft row is fed, in one pass, the tokens of its sequence it has
   not seen, ending with the request's pending token (sampled, not yet emitted). Rows
   need different numbers (a row whose proposal was accepted in full, or one that sat
   out a few steps, is further behind), so the pass is as wide as the longest catch-up,
   shorter rows end in filler, and rewind.py then drops each row's filler, as it drops
   rejected positions of the target's cache. A new row's prompt is read first, alone,
   at most `PROMPT_CHUNK` tokens of new prompts per step (paced: a long prompt does not
   pause the batch for the whole read), and the row drafts once it has caught up.
2. **Draft.** The logits at each row's last real position give its first proposed
   token (the argmax); each further token is one single-position pass for all rows.
3. **Forget the drafts.** The positions written in step 2 are trimmed from every row
   (all rows wrote the same number: one index move). Accepted drafts come back as
   catch-up at the next step, a few cheap positions of the small model.

Proposals are the draft's greedy continuation, a deterministic function of the
sequence, so verify.py's rule for a point-mass proposal applies unchanged: a sampled
row accepts a drafted token with exactly its probability under the target's
distribution (draws.py), and greedy rows get the target's own tokens.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from vllm_mlx.engine.cache.rows import BatchKVCache, row_caches
from vllm_mlx.engine.speculative.rewind import rewind

PROMPT_CHUNK = 256  # prompt tokens the draft reads for joining rows, per proposal step
# A row's sequence as the draft reads it: its record (prompt and emitted tokens), and
# its pending token (sampled, emitted next).
RowSequence = tuple[Sequence[int], int]

TIMED_PASSES = 5  # single-token passes of each model timed for the plan's draft cost


def measured_cost(draft: Any, target: Any) -> float:
    """A draft pass's cost in target decode steps, timed: one-token passes of each model
    over a short context, the median of a few after a warm-up. Timed, not read from the
    weights' sizes: a float32 draft beside a 4-bit target with the CPU kernel reads 2.3x
    the bytes per token that its time says (measured: 3.8 ms against 20 ms, 0.19)."""
    return _pass_seconds(draft) / max(_pass_seconds(target), 1e-6)


def _pass_seconds(model: Any) -> float:
    cache = make_prompt_cache(model)
    mx.eval(model(mx.zeros((1, 16), dtype=mx.int32), cache=cache))
    times = []
    for _ in range(TIMED_PASSES + 1):
        started = time.perf_counter()
        mx.eval(mx.argmax(model(mx.zeros((1, 1), dtype=mx.int32), cache=cache)[:, -1], axis=-1))
        times.append(time.perf_counter() - started)
    return sorted(times[1:])[TIMED_PASSES // 2]


class DraftModel:
    """The draft's cache for the speculating rows, and their proposals."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self._cache: list[Any] | None = None  # per layer: the draft's batch cache
        self._uids: list[int] = []  # draft row -> request uid
        self._seen: list[int] = []  # draft row -> tokens of its sequence in its cache
        # Rows still reading their prompt, alone: uid -> (their cache, tokens read).
        self._reading: dict[int, tuple[list[Any], int]] = {}

    def clear(self) -> None:
        self._cache, self._uids, self._seen, self._reading = None, [], [], {}

    def propose(
        self, sequences: dict[int, RowSequence], wanted: dict[int, int]
    ) -> dict[int, list[int]]:
        """Up to `wanted[uid]` tokens for each uid in `wanted`. `sequences`: every row
        that speculates with the draft (uid -> its record and pending token); rows not
        in it are dropped from the draft's cache."""
        self.sync(sequences)
        most = max(wanted.values(), default=0)
        if most < 1 or not self._uids:
            return {}
        tokens = self._catch_up(sequences)
        drafted = [tokens]
        for _ in range(most - 1):
            logits = self.model(tokens[:, None], cache=self._cache)
            tokens = mx.argmax(logits[:, -1, :], axis=-1)
            drafted.append(tokens)
        grid: list[list[int]] = mx.stack(drafted, axis=1).tolist()  # type: ignore[assignment]
        assert self._cache is not None
        for layer in self._cache:
            layer.trim(most - 1)
        index = {uid: row for row, uid in enumerate(self._uids)}
        return {uid: grid[index[uid]][:n] for uid, n in wanted.items() if n > 0 and uid in index}

    def sync(self, sequences: dict[int, RowSequence]) -> None:
        """Drop rows whose requests left; read the prompts of rows that joined."""
        keep = [row for row, uid in enumerate(self._uids) if uid in sequences]
        if len(keep) < len(self._uids):
            self._uids = [self._uids[row] for row in keep]
            self._seen = [self._seen[row] for row in keep]
            if not keep:
                self._cache = None
            elif self._cache is not None:
                for layer in self._cache:
                    layer.filter(mx.array(keep))
        self._reading = {uid: r for uid, r in self._reading.items() if uid in sequences}
        known, budget = set(self._uids), PROMPT_CHUNK
        for uid, (record, _) in sequences.items():
            if uid not in known and budget > 0:
                budget -= self._read(uid, record, budget)

    def _read(self, uid: int, record: Sequence[int], budget: int) -> int:
        """Read up to `budget` more tokens of a new row's record (its pending token comes
        with the catch-up, whose logits propose); once all are read, the row joins the
        batch. The tokens read."""
        reading = self._reading.pop(uid, None)
        layers, done = reading if reading is not None else (make_prompt_cache(self.model), 0)
        chunk = list(record[done : done + budget])
        if chunk:
            self.model(mx.array(chunk)[None], cache=layers)
            mx.eval([c.state for c in layers])
        done += len(chunk)
        if done < len(record):
            self._reading[uid] = (layers, done)
        else:
            self._join(uid, layers, done)
        return len(chunk)

    def _join(self, uid: int, layers: list[Any], read: int) -> None:
        rows = [BatchKVCache.merge([layer]) for layer in row_caches(layers)]
        if self._cache is None:
            self._cache = rows
        else:
            for mine, new in zip(self._cache, rows, strict=True):
                mine.extend(new)
        self._uids.append(uid)
        self._seen.append(read)

    def _catch_up(self, sequences: dict[int, RowSequence]) -> mx.array:
        """Feed each row what it has not seen; the argmax after each row's last token."""
        behind = []
        for uid, seen in zip(self._uids, self._seen, strict=True):
            record, pending = sequences[uid]
            behind.append([*record[seen:], pending])
        width = max(len(tokens) for tokens in behind)
        grid = [tokens + [tokens[-1]] * (width - len(tokens)) for tokens in behind]
        logits = self.model(mx.array(grid), cache=self._cache)
        last = mx.array([len(tokens) - 1 for tokens in behind])
        ends = mx.take_along_axis(logits, last[:, None, None], axis=1)[:, 0, :]
        first = mx.argmax(ends, axis=-1)
        assert self._cache is not None
        rewind(self._cache, width, [len(tokens) for tokens in behind])
        self._seen = [seen + len(t) for seen, t in zip(self._seen, behind, strict=True)]
        return first
