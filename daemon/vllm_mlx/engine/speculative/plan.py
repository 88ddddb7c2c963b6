"""How many positions a verify pass should feed, if any.

Every row of the batch is fed the same number of positions, so a pass that checks one
row's 4 proposed tokens makes all rows pay for 5 positions. Whether that pays depends on
what one more position and one more row cost against a decode step. Measured for the
bundled model on 2 CPU cores (docs/benchmarks.md, "Speculative decoding"): a one-row
step ~37 ms, each extra position of a row ~8 ms (0.2 of it), each extra row ~7 ms (0.2).
On a GPU both are far smaller, and these constants only make the plan cautious there.

A draft model (draft.py) adds its own passes: one per proposed position, each costing
`draft_cost` of the target's step at the same batch size (timed when the engine starts).

The plan picks the width with the best expected tokens per unit of time, counting each
row's proposal at its recent acceptance rate, and takes no verify pass at all when the
plain step is expected to do better.
"""

from __future__ import annotations

from collections.abc import Sequence

POSITION_COST = 0.2  # one more position of one row, in one-row decode steps
ROW_COST = 0.2  # one more row in a decode step, in one-row decode steps


def choose_width(
    rows: int,
    proposals: Sequence[tuple[int, float]],
    position_cost: float = POSITION_COST,
    row_cost: float = ROW_COST,
    draft_cost: float = 0.0,
) -> int:
    """Draft tokens to check per row (0: take the plain step). `proposals`: each
    proposing row's (tokens proposed, expected fraction of them accepted)."""
    step = 1 + row_cost * (rows - 1)
    best, best_rate = 0, rows / step
    for width in range(1, max((n for n, _ in proposals), default=0) + 1):
        gained = sum(rate * min(n, width) for n, rate in proposals)
        cost = step * (1 + draft_cost * width) + position_cost * rows * width
        speed = (rows + gained) / cost
        if speed > best_rate:
            best, best_rate = width, speed
    return best
