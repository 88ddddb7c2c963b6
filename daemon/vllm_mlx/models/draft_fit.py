"""check-config's test of each draft model against its target's tokenizer, before any
load (the rule and the message are models/draft.py's; the load checks it again)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

from vllm_mlx.config.errors import KeyPath
from vllm_mlx.config.model import ModelSettings
from vllm_mlx.models.draft import draft_settings, refusal, tokenizer_mismatch
from vllm_mlx.models.estimate import local_model_dir


def draft_tokenizer_problems(
    models: Sequence[ModelSettings], cache_dir: Path
) -> Iterator[tuple[KeyPath, str]]:
    """check-config: (key path, message) for each draft whose tokenizer differs from its
    target's, where both models' files are on this machine (a hub model not downloaded
    yet is checked when it loads)."""
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    for index, model in enumerate(models):
        draft = draft_settings(models, model)
        if draft is None:
            continue
        target_dir, draft_dir = local_model_dir(model, cache_dir), local_model_dir(draft, cache_dir)
        if target_dir is None or draft_dir is None or target_dir == draft_dir:
            continue
        why = tokenizer_mismatch(load_tokenizer(target_dir), load_tokenizer(draft_dir))
        if why is not None:
            yield ("models", index, "speculative", "draft_model"), refusal(model, draft, why)
