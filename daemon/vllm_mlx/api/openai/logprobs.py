"""Engine log-probabilities in OpenAI's two wire shapes.

Chat: `choices[].logprobs.content[]` entries with token, logprob, bytes, top_logprobs.
Completions (legacy): parallel lists tokens / token_logprobs / top_logprobs / text_offset.
A token's bytes are exact even when it holds part of a UTF-8 character; its text is
those bytes decoded with replacement characters, as OpenAI shows them.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import AsyncIterator, Sequence
from typing import Any

from vllm_mlx.engine.output import OutputEvent
from vllm_mlx.engine.types import TextDelta, TokenLogprob

_HEX_BYTE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet, reversed: each printable stand-in -> its byte."""
    kept = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    shifted = [b for b in range(256) if b not in kept]
    mapping = {chr(b): b for b in kept}
    mapping.update({chr(256 + i): b for i, b in enumerate(shifted)})
    return mapping


_BYTE_DECODER = _byte_decoder()


class TokenTexts:
    """Token id -> (text, bytes), memoised per tokenizer."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._special = frozenset(getattr(tokenizer, "all_special_ids", ()))
        vocab = tokenizer.get_vocab()
        self._byte_level = any(piece.startswith("Ġ") for piece in vocab)
        self._cache: dict[int, tuple[str, bytes]] = {}

    def get(self, token: int) -> tuple[str, bytes]:
        found = self._cache.get(token)
        if found is None:
            found = self._cache[token] = self._compute(token)
        return found

    def _compute(self, token: int) -> tuple[str, bytes]:
        piece = str(self._tokenizer.convert_ids_to_tokens(token))
        if token in self._special:
            raw = piece.encode()
        elif match := _HEX_BYTE.fullmatch(piece):  # SentencePiece byte fallback
            raw = bytes([int(match.group(1), 16)])
        elif self._byte_level and all(ch in _BYTE_DECODER for ch in piece):
            raw = bytes(_BYTE_DECODER[ch] for ch in piece)
        else:
            raw = piece.replace("\u2581", " ").encode()
        return raw.decode("utf-8", errors="replace"), raw


_TEXTS: weakref.WeakKeyDictionary[Any, TokenTexts] = weakref.WeakKeyDictionary()


def token_texts(tokenizer: Any) -> TokenTexts:
    try:
        texts = _TEXTS.get(tokenizer)
        if texts is None:
            texts = _TEXTS[tokenizer] = TokenTexts(tokenizer)
        return texts
    except TypeError:  # not weak-referenceable: no memo across requests
        return TokenTexts(tokenizer)


# --- chat ------------------------------------------------------------------------------


def _chat_item(texts: TokenTexts, token: int, logprob: float) -> dict[str, Any]:
    text, raw = texts.get(token)
    return {"token": text, "logprob": logprob, "bytes": list(raw)}


def chat_content(texts: TokenTexts, entries: Sequence[TokenLogprob]) -> list[dict[str, Any]]:
    out = []
    for entry in entries:
        item = _chat_item(texts, entry.token, entry.logprob)
        item["top_logprobs"] = [_chat_item(texts, t, v) for t, v in entry.top]
        out.append(item)
    return out


def chat_logprobs(texts: TokenTexts, entries: Sequence[TokenLogprob]) -> dict[str, Any]:
    return {"content": chat_content(texts, entries), "refusal": None}


# --- completions (legacy shape) --------------------------------------------------------


class LegacyLogprobs:
    """One choice's legacy logprobs, built as its text grows (offsets into that text)."""

    def __init__(self, texts: TokenTexts, offset: int = 0) -> None:
        self._texts = texts
        self.offset = offset

    def block(
        self, entries: Sequence[TokenLogprob | None], prompt: Sequence[int] = ()
    ) -> dict[str, Any]:
        """`entries` in text order; a None entry (the first prompt token) takes its token
        from `prompt` and has no values."""
        tokens: list[str] = []
        values: list[float | None] = []
        tops: list[dict[str, float] | None] = []
        offsets: list[int] = []
        for index, entry in enumerate(entries):
            token = prompt[index] if entry is None else entry.token
            text, _ = self._texts.get(token)
            tokens.append(text)
            offsets.append(self.offset)
            self.offset += len(text)
            if entry is None:
                values.append(None)
                tops.append(None)
                continue
            values.append(entry.logprob)
            top = {self._texts.get(t)[0]: v for t, v in entry.top}
            top.setdefault(text, entry.logprob)  # the chosen token is always listed
            tops.append(top)
        return {
            "tokens": tokens,
            "token_logprobs": values,
            "top_logprobs": tops,
            "text_offset": offsets,
        }


def merge_blocks(blocks: Sequence[dict[str, Any]]) -> dict[str, Any]:
    keys = ("tokens", "token_logprobs", "top_logprobs", "text_offset")
    return {key: [item for block in blocks for item in block[key]] for key in keys}


# --- collecting logprobs beside a text stream -----------------------------------------


class Tap:
    """Passes a request's output events through, keeping their logprobs aside, so the
    parsers (reasoning, tool calls) see plain text and a chunk takes what arrived."""

    def __init__(self, source: AsyncIterator[OutputEvent]) -> None:
        self._source = source
        self.pending: list[TokenLogprob] = []
        self.prompt: tuple[TokenLogprob | None, ...] | None = None

    async def events(self) -> AsyncIterator[OutputEvent]:
        async for event in self._source:
            if isinstance(event, TextDelta):
                self.pending.extend(event.logprobs)
                if event.prompt_logprobs is not None:
                    self.prompt = event.prompt_logprobs
            yield event

    def take(self) -> list[TokenLogprob]:
        taken, self.pending = self.pending, []
        return taken
