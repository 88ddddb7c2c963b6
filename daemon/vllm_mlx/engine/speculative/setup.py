"""Building a model's speculator from its settings: which method, and for a draft model,
whether both models can speculate and what a draft pass costs."""

from __future__ import annotations

from typing import Any

import structlog

from vllm_mlx.engine.speculative.config import SpeculativeConfig
from vllm_mlx.engine.speculative.draft import DraftModel, measured_cost
from vllm_mlx.engine.speculative.verify import Counters, Speculator, model_supports

log = structlog.get_logger(__name__)


def can_speculate(config: SpeculativeConfig | None, model: Any, draft: Any) -> bool:
    """Whether `config` can run here: plain KV layers in the target (and the draft), and a
    draft model loaded when the method needs one."""
    if config is None or not model_supports(model):
        return False
    if config.method != "draft":
        return True
    if draft is None:
        log.warning("speculative method draft without a draft model: speculation is off")
        return False
    return model_supports(draft)


def make_speculator(
    config: SpeculativeConfig | None, counters: Counters, model: Any, draft: Any
) -> Speculator | None:
    """A fresh speculator (and draft cache) for a new batch generator; None: off."""
    if config is None:
        return None
    if config.method != "draft":
        return Speculator(config, counters)
    cost = config.draft_cost if config.draft_cost is not None else measured_cost(draft, model)
    return Speculator(config, counters, draft=DraftModel(draft), draft_cost=cost)
