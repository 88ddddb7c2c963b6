"""Rebuild a Hugging Face tokenizer from the vocabulary stored in a GGUF file.

GGUF keeps the tokenizer as metadata (tokens, merges, token types, special ids, chat
template) rather than as a ``tokenizer.json``. mlx-lm loads tokenizers through
``transformers.AutoTokenizer``, so we write the files it expects: ``tokenizer.json``
(built with the ``tokenizers`` library) and ``tokenizer_config.json``.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

# llama.cpp token types (llama_token_type in llama-vocab.h).
_TOKEN_TYPE_CONTROL = 3
_TOKEN_TYPE_USER_DEFINED = 4

# llama.cpp names its pre-tokenizers after the models it met them in; these are the ones
# whose split rules we reproduce. Each entry is the regex split applied before the
# byte-level step (None: only GPT-2's own regex) and whether digits go one at a time.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_PRE_TOKENIZERS: dict[str, tuple[str | None, bool]] = {
    "default": (None, False),
    "gpt-2": (None, False),
    # StarCoder-family vocabularies (SmolLM included) split every digit on its own
    # before the GPT-2 regex; llama.cpp groups these names under one rule set.
    "smollm": (None, True),
    "starcoder": (None, True),
    "refact": (None, True),
    "llama-bpe": (_LLAMA3_SPLIT, False),
}

# Tokens that end a turn or a document in common chat vocabularies. GGUF records one
# eos id, but instruct models also emit the document terminator, and generation must
# stop at either.
_END_TOKEN_TEXTS = frozenset({"<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|end|>"})


class GGUFTokenizerError(ValueError):
    """The GGUF's tokenizer metadata is missing or of a kind we cannot rebuild."""


@dataclass(frozen=True)
class TokenizerFacts:
    """Ids the model config and generation config need from the tokenizer."""

    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    pad_token_id: int | None


def write_tokenizer_files(metadata: Mapping[str, Any], out_dir: pathlib.Path) -> TokenizerFacts:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` into ``out_dir``."""
    model_kind = metadata.get("tokenizer.ggml.model")
    if model_kind != "gpt2":
        raise GGUFTokenizerError(f"unsupported GGUF tokenizer model {model_kind!r}")
    tokens = _str_list(metadata, "tokenizer.ggml.tokens")
    merges = _str_list(metadata, "tokenizer.ggml.merges")
    types = [int(t) for t in _int_list(metadata, "tokenizer.ggml.token_type")]
    if len(types) != len(tokens):
        raise GGUFTokenizerError("token_type and tokens differ in length")

    tokenizer = _build_tokenizer(tokens, merges, types, _pre_name(metadata))
    tokenizer.save(str(out_dir / "tokenizer.json"))

    facts = _facts(metadata, tokens, types)
    config = _tokenizer_config(metadata, tokens, facts)
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return facts


def _build_tokenizer(
    tokens: Sequence[str], merges: Sequence[str], types: Sequence[int], pre: str
) -> Tokenizer:
    vocab = {tok: i for i, tok in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise GGUFTokenizerError("GGUF vocabulary has duplicate tokens")
    # Byte-level BPE maps spaces to "Ġ", so a merge's two halves never contain a space.
    pairs = [_split_merge(m) for m in merges]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False))

    split_regex, individual_digits = _PRE_TOKENIZERS[pre]
    steps: list[pre_tokenizers.PreTokenizer] = []
    if individual_digits:
        steps.append(pre_tokenizers.Digits(individual_digits=True))
    if split_regex is None:
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
    else:
        steps.append(pre_tokenizers.Split(Regex(split_regex), behavior="isolated"))
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(steps)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)

    # Control tokens must match whole in the input and be skippable when decoding;
    # user-defined ones match whole but are ordinary text.
    added = [
        AddedToken(tokens[i], special=t == _TOKEN_TYPE_CONTROL, normalized=False)
        for i, t in enumerate(types)
        if t in (_TOKEN_TYPE_CONTROL, _TOKEN_TYPE_USER_DEFINED)
    ]
    tokenizer.add_special_tokens([a for a in added if a.special])
    tokenizer.add_tokens([a for a in added if not a.special])
    return tokenizer


def _split_merge(merge: str) -> tuple[str, str]:
    left, sep, right = merge.partition(" ")
    if not sep or not left or not right:
        raise GGUFTokenizerError(f"malformed BPE merge {merge!r}")
    return left, right


def _pre_name(metadata: Mapping[str, Any]) -> str:
    pre = str(metadata.get("tokenizer.ggml.pre", "default"))
    if pre not in _PRE_TOKENIZERS:
        raise GGUFTokenizerError(f"unsupported GGUF pre-tokenizer {pre!r}")
    return pre


def _facts(
    metadata: Mapping[str, Any], tokens: Sequence[str], types: Sequence[int]
) -> TokenizerFacts:
    eos = _opt_int(metadata, "tokenizer.ggml.eos_token_id")
    ends: list[int] = [] if eos is None else [eos]
    for key in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
        extra = _opt_int(metadata, key)
        if extra is not None and extra not in ends:
            ends.append(extra)
    for i, (tok, kind) in enumerate(zip(tokens, types, strict=True)):
        if kind == _TOKEN_TYPE_CONTROL and tok in _END_TOKEN_TEXTS and i not in ends:
            ends.append(i)
    return TokenizerFacts(
        bos_token_id=_opt_int(metadata, "tokenizer.ggml.bos_token_id"),
        eos_token_ids=tuple(ends),
        pad_token_id=_opt_int(metadata, "tokenizer.ggml.padding_token_id"),
    )


def _tokenizer_config(
    metadata: Mapping[str, Any], tokens: Sequence[str], facts: TokenizerFacts
) -> dict[str, Any]:
    def text(token_id: int | None) -> str | None:
        return None if token_id is None else tokens[token_id]

    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": text(facts.bos_token_id),
        "eos_token": text(facts.eos_token_ids[0] if facts.eos_token_ids else None),
        "pad_token": text(facts.pad_token_id),
        "unk_token": text(_opt_int(metadata, "tokenizer.ggml.unknown_token_id")),
        "add_bos_token": _opt_bool(metadata, "tokenizer.ggml.add_bos_token", default=False),
        "add_eos_token": _opt_bool(metadata, "tokenizer.ggml.add_eos_token", default=False),
        "clean_up_tokenization_spaces": False,
    }
    context = metadata.get(f"{metadata.get('general.architecture')}.context_length")
    if context is not None:
        config["model_max_length"] = int(context.item())
    template = metadata.get("tokenizer.chat_template")
    if isinstance(template, str):
        config["chat_template"] = template
    return {k: v for k, v in config.items() if v is not None}


def _str_list(metadata: Mapping[str, Any], key: str) -> list[str]:
    value = metadata.get(key)
    if not isinstance(value, list):
        raise GGUFTokenizerError(f"GGUF metadata lacks {key}")
    return [str(v) for v in value]


def _int_list(metadata: Mapping[str, Any], key: str) -> list[int]:
    value = metadata.get(key)
    if value is None:
        raise GGUFTokenizerError(f"GGUF metadata lacks {key}")
    # mx.load returns numeric GGUF arrays as an mx.array.
    return [int(v) for v in value.tolist()]


def _opt_int(metadata: Mapping[str, Any], key: str) -> int | None:
    value = metadata.get(key)
    return None if value is None else int(value.item())


def _opt_bool(metadata: Mapping[str, Any], key: str, *, default: bool) -> bool:
    value = metadata.get(key)
    return default if value is None else bool(value.item())
