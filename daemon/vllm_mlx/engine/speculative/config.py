"""The speculative settings as the engine takes them, and which rows may use them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from vllm_mlx.engine.speculative.plan import POSITION_COST, ROW_COST


@dataclass(frozen=True)
class SpeculativeConfig:
    """A model's `speculative` section (config/speculative.py). Method `ngram`: prompt
    lookup (ngram.py); `draft`: a draft model's proposals (draft.py), the model itself
    handed to the engine with the target's weights (models/loaded.py)."""

    num_tokens: int = 4
    ngram_min: int = 2
    ngram_max: int = 4
    method: Literal["ngram", "draft"] = "ngram"
    # The verify plan's cost model (plan.py); position_cost 0 verifies every proposal
    # (tests use it to exercise every batch path, whatever it costs). draft_cost: a
    # draft pass against a target step; None: timed when the engine starts (draft.py).
    position_cost: float = POSITION_COST
    row_cost: float = ROW_COST
    draft_cost: float | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ValueError("need 1 <= ngram_min <= ngram_max")
        if self.num_tokens < 1:
            raise ValueError("num_tokens must be at least 1")
