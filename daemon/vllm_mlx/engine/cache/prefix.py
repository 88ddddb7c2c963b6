"""Prefix caches: reuse the KV cache of earlier prompts that share a prefix, under a hard
byte bound.

Two kinds share one small interface (`lookup`, `store`, `summary`, `stats`):
`PromptCache` keeps each finished sequence's whole KV cache (mlx-lm's LRUPromptCache does
the trie, nearest-prefix lookup and trimming); `PagedPrefixCache` (paged.py) keeps
fixed-size token blocks, shared between prompts. Both count the bytes of the real arrays
they hold and evict before they insert, so `nbytes <= max_bytes` holds after every store.
Only the engine thread calls them; other threads read the counters (plain ints).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import (
    LRUPromptCache,
    can_trim_prompt_cache,
    trim_prompt_cache,
)

_MODEL_KEY = "model"  # one cache per engine, so one key


@dataclass
class PrefixCacheStats:
    queries: int = 0  # requests looked up
    hits: int = 0  # requests that reused a cached prefix
    queried_tokens: int = 0
    hit_tokens: int = 0
    evictions: int = 0  # entries (whole prompts, or blocks when paged) evicted for room
    rejected: int = 0  # stores refused: larger than the whole bound, or an unpageable cache
    disk_hit_tokens: int = 0  # of hit_tokens, those read back from the disk tier

    @property
    def misses(self) -> int:
        return self.queries - self.hits


@dataclass(frozen=True)
class PrefixHit:
    cache: list[Any] | None  # per-layer KV cache for the first `cached` tokens
    cached: int  # prompt tokens covered by `cache`
    rest: list[int]  # prompt tokens still to process (never empty)


class PrefixCache:
    """The bookkeeping both kinds share: the bound, the counters, the status block."""

    kind = "prefix"

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.stats = PrefixCacheStats()

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    @property
    def entries(self) -> int:
        raise NotImplementedError

    @property
    def nbytes(self) -> int:
        raise NotImplementedError

    def lookup(self, prompt: Sequence[int]) -> PrefixHit:
        raise NotImplementedError

    def store(self, tokens: Sequence[int], cache: list[Any]) -> range:
        """Keep a finished sequence's cache; returns the positions in `tokens` whose KV
        this store newly wrote (empty: nothing new), so a request can say what it cached."""
        raise NotImplementedError

    def store_prompt(self, tokens: Sequence[int], cache: list[Any], prompt: int, read: int) -> int:
        """`store`, and how many of the first `prompt` tokens it newly wrote beyond the
        `read` ones the request took from the cache (its usage's cache writes)."""
        written = self.store(tokens, cache)
        return max(0, min(written.stop, prompt) - max(written.start, read))

    def held_bytes(self) -> int:
        """The bytes of the arrays actually held, recounted (an audit of `nbytes`)."""
        raise NotImplementedError

    def clear(self) -> int:
        """Drop every entry of the memory tier; returns how many."""
        raise NotImplementedError

    def close(self) -> None:
        """The engine stopped (a tier below may finish its writes)."""

    @property
    def disk_tier(self) -> Any:
        """The tier below (a DiskBlockStore), or None."""
        return None

    def cleared(self, memory: bool, disk: bool) -> dict[str, int]:
        """Empty the tiers asked for (engine thread); how many entries each dropped."""
        out = {}
        if memory:
            out["memory_entries"] = self.clear()
        if disk and self.disk_tier is not None:
            out["disk_entries"] = self.disk_tier.clear()
        return out

    def summary(self) -> dict[str, Any]:
        """The `cache` block of /v1/status."""
        stats = self.stats
        return {
            "type": self.kind if self.enabled else "none",
            "entries": self.entries,
            "hit_rate": round(stats.hits / stats.queries, 4) if stats.queries else 0.0,
            "memory_mb": round(self.nbytes / 2**20, 3),
            "max_memory_mb": round(self.max_bytes / 2**20, 3),
            "queries": stats.queries,
            "hits": stats.hits,
            "evictions": stats.evictions,
            "cached_tokens": stats.hit_tokens,
        }

    def _count(self, tokens: list[int], cached: int) -> None:
        self.stats.queries += 1
        self.stats.queried_tokens += len(tokens)
        if cached:
            self.stats.hits += 1
            self.stats.hit_tokens += cached


class PromptCache(PrefixCache):
    """Whole finished sequences, least recently stored first out."""

    kind = "prefix"

    def __init__(self, max_bytes: int, max_entries: int = 64) -> None:
        super().__init__(max_bytes)
        self.max_entries = max_entries
        self._lru = LRUPromptCache(max_size=max_entries, max_bytes=max_bytes)

    @property
    def entries(self) -> int:
        return len(self._lru)

    @property
    def nbytes(self) -> int:
        return int(self._lru.nbytes)

    def held_bytes(self) -> int:
        lru = self._lru
        entries = [
            lru._trie.get(model, tokens)
            for queue in lru._lru._lrus.values()
            for model, tokens in queue
        ]
        return sum(int(layer.nbytes) for entry in entries for layer in entry.prompt_cache)

    def clear(self) -> int:
        count = len(self._lru)
        self._lru = LRUPromptCache(max_size=self.max_entries, max_bytes=self.max_bytes)
        return count

    def lookup(self, prompt: Sequence[int]) -> PrefixHit:
        tokens = list(prompt)
        if not self.enabled:
            return PrefixHit(None, 0, tokens)
        cache, rest = self._lru.fetch_nearest_cache(_MODEL_KEY, tokens)
        hit = PrefixHit(None, 0, tokens)
        if cache is not None:
            rest = list(rest)
            if rest:
                hit = PrefixHit(cache, len(tokens) - len(rest), rest)
            elif can_trim_prompt_cache(cache):
                # An exact hit: the last prompt token must still be fed to get the first
                # output logits, so step the cache back by one.
                trim_prompt_cache(cache, 1)
                hit = PrefixHit(cache, len(tokens) - 1, tokens[-1:])
        self._count(tokens, hit.cached)
        return hit

    def store(self, tokens: Sequence[int], cache: list[Any]) -> range:
        """Keep a finished sequence's cache; `tokens` are exactly what it holds.

        A cache taken from a batch is a lazy slice of the whole batch's KV buffers:
        kept unevaluated, every entry would hold a full batch alive while being counted
        at its own size (the bound held on paper while real memory grew by gigabytes).
        Evaluating it here gives each entry its own buffers of exactly the size counted.
        """
        if not (self.enabled and tokens):
            return range(0)
        mx.eval([layer.state for layer in cache])
        size = sum(int(layer.nbytes) for layer in cache)
        if size > self.max_bytes:
            self.stats.rejected += 1
            return range(0)
        # Evict first, so the bound holds at every moment, not only after the insert.
        before = len(self._lru)
        self._lru.trim_to(n_sequences=self.max_entries - 1, n_bytes=self.max_bytes - size)
        self.stats.evictions += before - len(self._lru)
        self._lru.insert_cache(_MODEL_KEY, list(tokens), cache)
        return range(len(tokens))  # a whole copy of the sequence, prefix and all
