"""Paged prefix cache: KV kept in fixed-size token blocks that prompts share.

Block i of a prompt is keyed by a hash chain: its key digests block i-1's key and its
own token ids, so one key names the whole prefix up to that block's end, and two prompts
that agree on their first N tokens map those N // BLOCK_TOKENS blocks to the same keys.
A shared system prompt is therefore held once however many prompts extend it. A lookup
walks the prompt's chain, then takes the leading tokens it shares with one cached child
of the last block found, so hits are exact to the token: a prompt that diverges from a
cached one mid-block reuses everything before the divergence.

Each block owns its arrays (keys and values of every layer, stacked: one new buffer per
block, never a view into a finished batch's KV), so the bytes counted are the bytes
held, and evicting a block frees them. Eviction is least recently used; a lookup or
store touches a chain deepest block first, so a parent is always more recent than its
children and the oldest block is never the parent of a live one.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import KVCache

from vllm_mlx.engine.cache.disk import DiskBlockStore, as_disk_block
from vllm_mlx.engine.cache.prefix import PrefixCache, PrefixHit
from vllm_mlx.engine.cache.rows import RowKVCache

# Tokens per block: smaller blocks reuse more of a divergent prompt, larger ones mean
# fewer arrays to build and join. 16 (as vLLM) also reuses a short chat template's
# default system prompt; a 4k-token prompt is 256 blocks.
BLOCK_TOKENS = 16


@dataclass(frozen=True)
class _Block:
    keys: mx.array  # (layers, 1, kv_heads, BLOCK_TOKENS, head_dim)
    values: mx.array
    nbytes: int
    parent: bytes  # the previous block's key; b"" for a prompt's first block
    tokens: tuple[int, ...]  # this block's token ids


def block_keys(tokens: Sequence[int], count: int, size: int = BLOCK_TOKENS) -> list[bytes]:
    """The chain keys of the first `count` whole blocks of `tokens`."""
    keys: list[bytes] = []
    parent = b""
    for index in range(count):
        chunk = array("q", tokens[index * size : (index + 1) * size]).tobytes()
        parent = hashlib.blake2b(parent + chunk, digest_size=16).digest()
        keys.append(parent)
    return keys


def _sliceable(cache: list[Any]) -> bool:
    """Plain KV caches whose layers agree on shape and dtype (so blocks can stack them)."""
    plain = (KVCache, RowKVCache)  # a batch row's: mlx-lm's with a tag (rows.py)
    if not cache or not all(type(layer) in plain and layer.keys is not None for layer in cache):
        return False
    shapes = {
        (layer.keys.shape[1], layer.keys.shape[3], layer.values.shape[3], layer.keys.dtype)
        for layer in cache
    }
    return len(shapes) == 1


class PagedPrefixCache(PrefixCache):
    kind = "paged"

    def __init__(
        self, max_bytes: int, block_tokens: int = BLOCK_TOKENS, disk: DiskBlockStore | None = None
    ) -> None:
        super().__init__(max_bytes)
        self.block_tokens = block_tokens
        self.disk = disk  # the tier below: read on a memory miss, written on every store
        self._blocks: OrderedDict[bytes, _Block] = OrderedDict()  # least recent first
        self._children: dict[bytes, set[bytes]] = {}  # parent key -> its cached blocks
        self._nbytes = 0

    @property
    def entries(self) -> int:
        return len(self._blocks)

    @property
    def nbytes(self) -> int:
        return self._nbytes

    def held_bytes(self) -> int:
        return sum(int(b.keys.nbytes + b.values.nbytes) for b in self._blocks.values())

    def _present(self, keys: list[bytes]) -> int:
        """How many of the leading keys are cached."""
        for index, key in enumerate(keys):
            if key not in self._blocks:
                return index
        return len(keys)

    def _touch(self, keys: list[bytes]) -> None:
        for key in reversed(keys):  # deepest first: parents end up more recent
            self._blocks.move_to_end(key)

    def lookup(self, prompt: Sequence[int]) -> PrefixHit:
        tokens = list(prompt)
        hit = PrefixHit(None, 0, tokens)
        if not self.enabled:
            return hit
        # At least one prompt token is left to feed: it yields the first output logits.
        usable = (len(tokens) - 1) // self.block_tokens
        keys = block_keys(tokens, usable, self.block_tokens)
        found = keys[: self._present(keys)]
        if self.disk is not None and len(found) < len(keys):
            found = self._from_disk(keys, found, tokens)
        whole = len(found) * self.block_tokens
        # The next block may still share its first tokens with the prompt: take those too,
        # so a repeat reuses exactly the KV its first run computed (seeded sampling then
        # reproduces), and a divergent prompt reuses up to the very token it diverges at.
        after = tokens[whole : min(whole + self.block_tokens, len(tokens) - 1)]
        partial, extra = self._partial(found[-1] if found else b"", after)
        if found or partial is not None:
            chain = found + ([partial] if partial is not None else [])
            self._touch(chain)
            cached = whole + extra
            hit = PrefixHit(self._assemble(chain, cached), cached, tokens[cached:])
        self._count(tokens, hit.cached)
        return hit

    def _from_disk(self, keys: list[bytes], found: list[bytes], tokens: list[int]) -> list[bytes]:
        """`found` extended by the chain's next blocks read from disk, each placed in
        memory too (beside the chain, within the bound: never evicting the chain)."""
        assert self.disk is not None
        self._touch(found)
        room = self.max_bytes - sum(self._blocks[key].nbytes for key in found)
        size = self.block_tokens
        chain = list(found)
        for index in range(len(found), len(keys)):
            wanted = tokens[index * size : (index + 1) * size]
            stored = self.disk.get(keys[index], wanted)
            if stored is None:
                break
            nbytes = int(stored.keys.nbytes + stored.values.nbytes)
            if nbytes > room:
                break
            room -= nbytes
            self._evict(nbytes, keep=set(chain))
            mx.eval(stored.keys, stored.values)
            parent = chain[-1] if chain else b""
            block = _Block(stored.keys, stored.values, nbytes, parent, tuple(wanted))
            self._blocks[keys[index]] = block
            self._children.setdefault(parent, set()).add(keys[index])
            self._nbytes += nbytes
            self.stats.disk_hit_tokens += size
            chain.append(keys[index])
        return chain

    def _partial(self, parent: bytes, wanted: list[int]) -> tuple[bytes | None, int]:
        """The child of `parent` sharing the most leading tokens with `wanted`, and how many."""
        best: tuple[bytes | None, int] = (None, 0)
        for key in self._children.get(parent, ()):
            shared = 0
            for ours, theirs in zip(self._blocks[key].tokens, wanted, strict=False):
                if ours != theirs:
                    break
                shared += 1
            if shared > best[1]:
                best = (key, shared)
        return best

    def _assemble(self, keys: list[bytes], length: int) -> list[Any]:
        """A fresh per-layer KV cache of the first `length` tokens of the blocks (the
        request owns it)."""
        blocks = [self._blocks[key] for key in keys]
        all_keys = mx.concatenate([block.keys for block in blocks], axis=3)[..., :length, :]
        all_values = mx.concatenate([block.values for block in blocks], axis=3)[..., :length, :]
        mx.eval(all_keys, all_values)
        caches: list[Any] = []
        for layer in range(all_keys.shape[0]):
            cache = KVCache()
            cache.keys, cache.values = all_keys[layer], all_values[layer]
            cache.offset = length
            caches.append(cache)
        return caches

    def store(self, tokens: Sequence[int], cache: list[Any]) -> range:
        """Keep the whole blocks of a finished sequence that are not cached yet."""
        if not (self.enabled and tokens):
            return range(0)
        if not _sliceable(cache):
            self.stats.rejected += 1
            return range(0)
        size = self.block_tokens
        length = min(len(tokens), *(int(layer.offset) for layer in cache))
        keys = block_keys(tokens, length // size, size)
        present = self._present(keys)
        self._touch(keys[:present])
        new = self._fitting(keys[:present], keys[present:], self._block_bytes(cache))
        if not new:
            return range(0)
        blocks = [
            self._slice(cache, tokens, keys[present + i - 1] if present + i else b"", present + i)
            for i in range(len(new))
        ]
        # Sizes are known before evaluation: evict first, so the bound holds throughout.
        self._evict(sum(block.nbytes for block in blocks))
        mx.eval([(block.keys, block.values) for block in blocks])
        for key, block in reversed(list(zip(new, blocks, strict=True))):
            self._blocks[key] = block
            self._children.setdefault(block.parent, set()).add(key)
            self._nbytes += block.nbytes
        self._touch(keys[:present])
        if self.disk is not None:
            self._to_disk(list(zip(new, blocks, strict=True)))
        return range(present * size, (present + len(new)) * size)

    def _block_bytes(self, cache: list[Any]) -> int:
        per_token = sum(
            (layer.keys.nbytes + layer.values.nbytes) // layer.keys.shape[2] for layer in cache
        )
        return int(per_token) * self.block_tokens

    def _fitting(self, kept: list[bytes], new: list[bytes], block_bytes: int) -> list[bytes]:
        """The leading new blocks that fit beside the chain's cached ones (never evicted
        for its own extension); a chain longer than the bound keeps what fits."""
        room = self.max_bytes - sum(self._blocks[key].nbytes for key in kept)
        fit = max(0, room // block_bytes) if block_bytes else 0
        if fit < len(new):
            self.stats.rejected += 1
        return new[:fit]

    def _slice(self, cache: list[Any], tokens: Sequence[int], parent: bytes, index: int) -> _Block:
        start = index * self.block_tokens
        end = start + self.block_tokens
        # mx.stack writes a new buffer: the block never keeps the source batch alive.
        keys = mx.stack([layer.keys[..., start:end, :] for layer in cache])
        values = mx.stack([layer.values[..., start:end, :] for layer in cache])
        size = int(keys.nbytes + values.nbytes)
        return _Block(keys, values, size, parent, tuple(tokens[start:end]))

    def _to_disk(self, blocks: list[tuple[bytes, _Block]]) -> None:
        """Queue new blocks for the disk tier; the writer thread only copies bytes."""
        assert self.disk is not None
        queued = [
            (key, as_disk_block(block.keys, block.values, block.parent, block.tokens))
            for key, block in blocks
            if key not in self.disk
        ]
        mx.eval([(stored.keys, stored.values) for _, stored in queued])
        for key, stored in queued:
            self.disk.put(key, stored)

    def close(self) -> None:
        if self.disk is not None:
            self.disk.close()

    @property
    def disk_tier(self) -> DiskBlockStore | None:
        return self.disk

    def summary(self) -> dict[str, Any]:
        out = super().summary()
        if self.disk is not None:
            out["disk"] = {**self.disk.summary(), "hit_tokens": self.stats.disk_hit_tokens}
        return out

    def clear(self) -> int:
        """Drop every block (the memory tier); returns how many."""
        count = len(self._blocks)
        self._blocks.clear()
        self._children.clear()
        self._nbytes = 0
        return count

    def _evict(self, needed: int, keep: set[bytes] | None = None) -> None:
        """Drop least recently used blocks until `needed` more bytes fit the bound
        (never one of `keep`: the chain being assembled)."""
        while self._blocks and self._nbytes + needed > self.max_bytes:
            key = next(iter(self._blocks))
            if keep and key in keep:
                self._blocks.move_to_end(key)  # it is in use: the next oldest goes
                if all(k in keep for k in self._blocks):
                    return
                continue
            block = self._blocks.pop(key)
            siblings = self._children.get(block.parent)
            if siblings is not None:
                siblings.discard(key)
                if not siblings:
                    del self._children[block.parent]
            self._nbytes -= block.nbytes
            self.stats.evictions += 1
