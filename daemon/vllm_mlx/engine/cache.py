"""Prefix cache: reuse the KV cache of earlier prompts that share a prefix, memory-bounded.

mlx-lm's LRUPromptCache does the bookkeeping (a trie of token sequences, nearest-prefix
lookup, trimming a longer entry down to the common prefix, LRU eviction by bytes); this
wrapper adapts it to the engine thread and counts queries and hits. Only the engine
thread calls it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import LRUPromptCache, can_trim_prompt_cache, trim_prompt_cache

_MODEL_KEY = "model"  # one cache per engine, so one key


@dataclass
class PrefixCacheStats:
    queries: int = 0  # requests looked up
    hits: int = 0  # requests that reused a cached prefix
    queried_tokens: int = 0
    hit_tokens: int = 0


@dataclass(frozen=True)
class PrefixHit:
    cache: list[Any] | None  # per-layer KV cache for the first `cached` tokens
    cached: int  # prompt tokens covered by `cache`
    rest: list[int]  # prompt tokens still to process (never empty)


class PrefixCache:
    def __init__(self, max_bytes: int, max_entries: int = 64) -> None:
        self.max_bytes = max_bytes
        self._lru = LRUPromptCache(max_size=max_entries, max_bytes=max_bytes)
        self.stats = PrefixCacheStats()

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    @property
    def entries(self) -> int:
        return len(self._lru)

    @property
    def nbytes(self) -> int:
        return int(self._lru.nbytes)

    def summary(self) -> dict[str, Any]:
        """The `cache` block of /v1/status."""
        stats = self.stats
        return {
            "type": "prefix" if self.enabled else "none",
            "entries": self.entries,
            "hit_rate": round(stats.hits / stats.queries, 4) if stats.queries else 0.0,
            "memory_mb": round(self.nbytes / 2**20, 3),
            "queries": stats.queries,
            "hits": stats.hits,
            "cached_tokens": stats.hit_tokens,
        }

    def lookup(self, prompt: Sequence[int]) -> PrefixHit:
        tokens = list(prompt)
        if not self.enabled:
            return PrefixHit(None, 0, tokens)
        self.stats.queries += 1
        self.stats.queried_tokens += len(tokens)
        cache, rest = self._lru.fetch_nearest_cache(_MODEL_KEY, tokens)
        if cache is None:
            return PrefixHit(None, 0, tokens)
        rest = list(rest)
        if not rest:
            # An exact hit: the last prompt token must still be fed to get the first
            # output logits, so step the cache back by one.
            if not can_trim_prompt_cache(cache):
                return PrefixHit(None, 0, tokens)
            trim_prompt_cache(cache, 1)
            rest = tokens[-1:]
        cached = len(tokens) - len(rest)
        self.stats.hits += 1
        self.stats.hit_tokens += cached
        return PrefixHit(cache, cached, rest)

    def store(self, tokens: Sequence[int], cache: list[Any]) -> None:
        """Keep a finished sequence's cache; `tokens` are exactly what it holds.

        A cache taken from a batch is a lazy slice of the whole batch's KV buffers:
        kept unevaluated, every entry would hold a full batch alive while being counted
        at its own size (the bound held on paper while real memory grew by gigabytes).
        Evaluating it here gives each entry its own buffers of exactly the size counted.
        """
        if self.enabled and tokens:
            mx.eval([layer.state for layer in cache])
            self._lru.insert_cache(_MODEL_KEY, list(tokens), cache)
