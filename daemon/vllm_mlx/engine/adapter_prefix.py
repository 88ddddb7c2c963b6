"""Prefix-cache keys per LoRA adapter: a prefix computed under one adapter (or the base)
is never reused for another.

Both prefix caches (engine/cache/prefix.py, paged.py, and the disk tier below paged) key
entries by token ids. A request under an adapter looks up and stores its tokens moved
into a range of ids of the adapter's own (`t + namespace << SHIFT`, namespace from the
adapter's tag, a digest of its files), so its entries can only ever match requests of
the same adapter files, in this process or, through the disk tier, a later one. The
base keeps the plain ids. Lengths are unchanged, so the cached KV lines up as before.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from vllm_mlx.engine.cache.prefix import PrefixCache, PrefixHit

SHIFT = 24  # vocabularies up to 16M ids
NAMESPACE_BITS = 38  # with SHIFT, every key id stays below 2**62 (int64 in block keys)


def namespace(tag: str) -> int:
    digest = hashlib.blake2b(tag.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % ((1 << NAMESPACE_BITS) - 1) + 1


def keyed_tokens(tokens: Sequence[int], tag: str | None) -> list[int]:
    if tag is None:
        return list(tokens)
    offset = namespace(tag) << SHIFT
    return [t + offset for t in tokens]


class KeyedPrefixCache(PrefixCache):
    """`inner` as one adapter sees it: lookups and stores in the adapter's key range;
    the hit's remaining tokens are the request's own ids again."""

    def __init__(self, inner: PrefixCache, tag: str) -> None:
        super().__init__(inner.max_bytes)
        self.inner = inner
        self.tag = tag
        self.stats = inner.stats

    @property
    def entries(self) -> int:
        return self.inner.entries

    @property
    def nbytes(self) -> int:
        return self.inner.nbytes

    def lookup(self, prompt: Sequence[int]) -> PrefixHit:
        hit = self.inner.lookup(keyed_tokens(prompt, self.tag))
        return PrefixHit(hit.cache, hit.cached, list(prompt[hit.cached :]))

    def store(self, tokens: Sequence[int], cache: list[Any]) -> range:
        return self.inner.store(keyed_tokens(tokens, self.tag), cache)

    def held_bytes(self) -> int:
        return self.inner.held_bytes()

    def clear(self) -> int:
        return self.inner.clear()


def keyed_cache(cache: PrefixCache, tag: str | None) -> PrefixCache:
    """The prefix cache as a request under adapter `tag` uses it (None: the base's)."""
    return cache if tag is None else KeyedPrefixCache(cache, tag)
