"""The engine's prefix cache, chosen from its settings and the model's cache layout.

Apart from prefix.py and paged.py because it needs both kinds, and paged.py builds on
prefix.py's interface.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mlx_lm.models.cache import KVCache, make_prompt_cache

from vllm_mlx.engine.cache.disk import DiskBlockStore
from vllm_mlx.engine.cache.paged import PagedPrefixCache
from vllm_mlx.engine.cache.prefix import PrefixCache, PromptCache


def pageable(model: Any) -> bool:
    """Whether every layer keeps a plain growing KV cache, which blocks can slice.

    Sliding-window (rotating), quantised and state-space caches are not position-sliceable.
    """
    return all(type(layer) is KVCache for layer in make_prompt_cache(model))


def make_prefix_cache(
    model: Any, max_bytes: int, paged: bool, disk: Callable[[], DiskBlockStore] | None = None
) -> PrefixCache:
    """The engine's cache: paged when asked and the model's cache can be paged, with the
    disk tier below it when `disk` opens one (only blocks have a disk format)."""
    if paged and max_bytes > 0 and pageable(model):
        return PagedPrefixCache(max_bytes, disk=disk() if disk is not None else None)
    return PromptCache(max_bytes)
