"""A model's draft model (`speculative: {method: draft, draft_model: ...}`): which model it
is, its load beside the target, and the check that it shares the target's tokenizer.

A draft proposes token ids that the target checks, so both must mean the same text by
the same id: the same vocabulary (every token string at the same id) and the same
special tokens. A draft with another tokenizer would be accepted almost never while
costing every pass, and its ids past the target's vocabulary would be nonsense: it is
refused when it loads, and by check-config when both models' files are on the machine.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from vllm_mlx.config.errors import KeyPath
from vllm_mlx.config.model import ModelSettings, named_model


def draft_settings(models: Sequence[ModelSettings], model: ModelSettings) -> ModelSettings | None:
    """How to load `model`'s draft: the named model's settings (no speculation of its
    own), or a plain generation model of the source; None without a draft."""
    spec = model.speculative
    if spec.method != "draft" or spec.draft_model is None:
        return None
    named = named_model(models, spec.draft_model)
    if named is not None:
        return named.model_copy(update={"speculative": type(spec)(), "adapters": []})
    return ModelSettings(name=f"{model.name} (draft)", source=spec.draft_model)


def tokenizer_mismatch(target: Any, draft: Any) -> str | None:
    """Why `draft` (an mlx-lm or Hugging Face tokenizer) cannot draft for `target`, or
    None when both have the same vocabulary and special tokens."""
    a, b = _hf(target), _hf(draft)
    vocab_a, vocab_b = a.get_vocab(), b.get_vocab()
    if vocab_a != vocab_b:
        differ = sorted(set(vocab_a.items()) ^ set(vocab_b.items()), key=lambda kv: kv[1])
        sample = ", ".join(f"{token!r}={index}" for token, index in differ[:3])
        return (
            f"the vocabularies differ ({len(vocab_a)} and {len(vocab_b)} tokens; "
            f"not in both: {sample})"
        )
    for attribute in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id"):
        if getattr(a, attribute, None) != getattr(b, attribute, None):
            return (
                f"the special tokens differ ({attribute} {getattr(a, attribute, None)} and "
                f"{getattr(b, attribute, None)})"
            )
    if sorted(a.all_special_tokens) != sorted(b.all_special_tokens):
        return "the special tokens differ"
    return None


def _hf(tokenizer: Any) -> Any:
    """The Hugging Face tokenizer inside mlx-lm's wrapper."""
    return getattr(tokenizer, "_tokenizer", tokenizer)


def refusal(model: ModelSettings, draft: ModelSettings, why: str) -> str:
    return (
        f"draft_model {model.speculative.draft_model!r} ({draft.source}) cannot draft for "
        f"model {model.name!r} ({model.source}): {why}; a draft needs the same tokenizer"
    )


def draft_tokenizer_problems(
    models: Sequence[ModelSettings], cache_dir: Path
) -> Iterator[tuple[KeyPath, str]]:
    """check-config: (key path, message) for each draft whose tokenizer differs from its
    target's, where both models' files are on this machine (a hub model not downloaded
    yet is checked when it loads)."""
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    from vllm_mlx.models.estimate import local_model_dir

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
