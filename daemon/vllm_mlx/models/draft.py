"""A model's draft model (`speculative: {method: draft, draft_model: ...}`): which model it
is, its load beside the target, and the check that it shares the target's tokenizer.

A draft proposes token ids that the target checks, so both must mean the same text by
the same id: the same vocabulary (every token string at the same id) and the same
special tokens. A draft with another tokenizer would be accepted almost never while
costing every pass, and its ids past the target's vocabulary would be nonsense: it is
refused when it loads (models/loader.py), and by check-config when both models' files
are on the machine (models/draft_fit.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vllm_mlx.config.model import ModelSettings
from vllm_mlx.config.model_checks import named_model


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
