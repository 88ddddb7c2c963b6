"""A model's `speculative` section: speculative decoding by prompt lookup (n-gram) or a
draft model (docs/speculative.md)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import model_validator

from vllm_mlx.config.fields import LocatedError, Reload, Section, setting

MAX_DRAFT_TOKENS = 16
MAX_NGRAM = 32
# vLLM's `speculative_config` names, read as ours: a section copied from a vLLM setup
# works unchanged.
VLLM_KEYS = {
    "num_speculative_tokens": "num_tokens",
    "prompt_lookup_min": "ngram_min",
    "prompt_lookup_max": "ngram_max",
    "model": "draft_model",
}
VLLM_METHODS = {"draft_model": "draft"}


class SpeculativeSettings(Section):
    method: Literal["ngram", "draft"] | None = setting(
        None,
        Reload.MODEL,
        "`ngram`: prompt lookup, model-free: a request's next tokens are proposed from "
        "what followed the latest earlier occurrence of its last n tokens (prompt and "
        "reply), and the model checks them all in one pass; greedy output is the same "
        "tokens as without it, sampled output follows the same distribution. Helps when "
        "the reply repeats its input (code edits, quoting, JSON echoing keys). `draft`: "
        "a small model with the same tokenizer (`draft_model`) proposes them. Unset: "
        "off (docs/speculative.md).",
    )
    draft_model: str | None = setting(
        None,
        Reload.MODEL,
        "For `method: draft`: the draft model, the name of another model in `models` "
        "(its source and dtype are used) or a source as in `source`. It must have this "
        "model's tokenizer (same vocabulary and special tokens), checked when it loads "
        "and by check-config when both models' files are on the machine.",
        min_length=1,
    )
    num_tokens: int = setting(
        4,
        Reload.MODEL,
        "Most tokens proposed per request per step (1 to 16).",
        ge=1,
        le=MAX_DRAFT_TOKENS,
    )
    ngram_min: int = setting(
        2,
        Reload.MODEL,
        "Shortest tail of the sequence looked up for a proposal (1 to 32, at most "
        "`ngram_max`); 1 proposes after any repeated token, more often wrongly.",
        ge=1,
        le=MAX_NGRAM,
    )
    ngram_max: int = setting(
        4,
        Reload.MODEL,
        "Longest tail looked up; the longest that matches wins (1 to 32).",
        ge=1,
        le=MAX_NGRAM,
    )

    @model_validator(mode="before")
    @classmethod
    def _vllm_names(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        out = dict(data)
        for theirs, ours in VLLM_KEYS.items():
            if theirs not in out:
                continue
            if ours in out:
                raise LocatedError(
                    f"{theirs} is vLLM's name for {ours}; give one of them", (theirs,)
                )
            out[ours] = out.pop(theirs)
        method = out.get("method")
        if isinstance(method, str) and method in VLLM_METHODS:
            out["method"] = VLLM_METHODS[method]
        return out

    @model_validator(mode="after")
    def _draft_model_named(self) -> SpeculativeSettings:
        if self.method == "draft" and self.draft_model is None:
            raise LocatedError(
                "method draft needs draft_model: a model in `models` or a source",
                ("draft_model",),
            )
        if self.method != "draft" and self.draft_model is not None:
            raise LocatedError(
                f"draft_model is used by method draft only (method is {self.method})",
                ("draft_model",),
            )
        return self

    @model_validator(mode="after")
    def _ngram_range(self) -> SpeculativeSettings:
        if self.ngram_min > self.ngram_max:
            raise LocatedError(
                f"ngram_min ({self.ngram_min}) must not exceed ngram_max ({self.ngram_max})",
                ("ngram_min",),
            )
        return self
