"""Which rerank method a model's files call for, when `rerank_method` does not say.

A BERT saved as `...ForSequenceClassification` is a cross-encoder; a sentence-embedding
folder (a bare BERT, or sentence-transformers' modules.json) scores by cosine; anything
else is taken for a causal LM and scored by P("yes").
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal, cast

RerankMethod = Literal["cross_encoder", "llm", "embedding"]


def rerank_method_of(model_dir: Path, configured: str | None) -> RerankMethod:
    if configured is not None:
        return cast("RerankMethod", configured)
    path = model_dir / "config.json"
    config = json.loads(path.read_text()) if path.is_file() else {}
    architectures = config.get("architectures") or [] if isinstance(config, dict) else []
    if any(str(a).endswith("ForSequenceClassification") for a in architectures):
        return "cross_encoder"
    sentence = (model_dir / "modules.json").is_file()
    if sentence or (isinstance(config, dict) and config.get("model_type") == "bert"):
        return "embedding"
    return "llm"
