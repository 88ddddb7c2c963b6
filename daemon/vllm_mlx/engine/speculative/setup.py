"""Building a model's speculator from its settings (which method; for a draft model,
whether both models can speculate and what a draft pass costs) and putting a request's
row under it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import structlog

from vllm_mlx.engine.speculative.config import SpeculativeConfig
from vllm_mlx.engine.speculative.draft import DraftModel, measured_cost
from vllm_mlx.engine.speculative.verify import Counters, Speculator, eligible, model_supports
from vllm_mlx.engine.types import GenerationRequest

log = structlog.get_logger(__name__)

# Prompt tokens put before a prediction in its lookup index: the longest tail looked up.
PROMPT_TAIL = 32
# A prediction is indexed up to twice the reply's max_tokens (and at least this many): a
# reply cannot use more, and indexing runs on the engine thread (a few dict operations a
# token), so a 1 MiB prediction for a short reply must not stall every stream.
PREDICTION_FLOOR = 1024


def can_speculate(config: SpeculativeConfig | None, model: Any, draft: Any) -> bool:
    """Whether the engine can speculate at all: plain KV layers in the target (and the
    draft, for `method: draft`). Without a `speculative` section it still can, for the
    requests that ask (a prediction, or `speculative: "ngram"`)."""
    if not model_supports(model):
        return False
    if config is None or config.method != "draft":
        return True
    if draft is None:
        log.warning("speculative method draft without a draft model: only lookup rows draft")
        return True
    return model_supports(draft)


def make_speculator(
    enabled: bool, config: SpeculativeConfig | None, counters: Counters, model: Any, draft: Any
) -> Speculator | None:
    """A fresh speculator (and draft cache) for a new batch generator; None: off."""
    if not enabled:
        return None
    if config is None:  # no section: prompt lookup for the rows that ask only
        return Speculator(SpeculativeConfig(), counters, method=None)
    if config.method != "draft" or draft is None:
        return Speculator(config, counters)
    cost = config.draft_cost if config.draft_cost is not None else measured_cost(draft, model)
    return Speculator(config, counters, draft=DraftModel(draft), draft_cost=cost)


def register_row(
    speculator: Speculator | None,
    uid: int,
    request: GenerationRequest,
    sampler: Any,
    processors: Sequence[Any],
) -> Callable[[], tuple[int, int] | None] | None:
    """Put row `uid` under the speculator when it may and should speculate: the method
    it names, prompt lookup for a prediction, else the model's. For a request with a
    prediction, what reads its (proposed, accepted) tokens (its usage reports them)."""
    if speculator is None or not eligible(request, sampler, processors):
        return None
    method = request.speculative_method
    method = method or ("ngram" if request.prediction else speculator.method)
    if method is None or (method == "draft" and speculator.draft is None):
        return None
    prediction = request.prediction[: max(2 * request.max_tokens, PREDICTION_FLOOR)]
    tail = request.prompt_tokens[-PROMPT_TAIL:] if prediction else ()
    speculator.add(uid, method, (*tail, *prediction))
    return partial(speculator.acceptance, uid) if request.prediction else None
