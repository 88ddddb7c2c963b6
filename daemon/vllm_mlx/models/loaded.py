"""What a model source resolves to, and what the engine consumes: models/ produces it,
engine/ runs it (so the import arrow runs one way, from engine to models)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class LoadedModel:
    """What a model source resolves to: weights in memory plus their tokenizer."""

    name: str
    model: Any  # mlx.nn.Module; kept opaque so this module needs no mlx import
    tokenizer: Any  # mlx_lm TokenizerWrapper
    context_length: int
    directory: str
    load_seconds: float = 0.0
    # A model sharded over a distributed group: the scheduler's Lockstep (rank 0).
    lockstep: Any = None
