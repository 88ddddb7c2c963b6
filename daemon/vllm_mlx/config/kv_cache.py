"""A model's `kv_cache` section: quantizing the live KV cache (docs/caching.md)."""

from __future__ import annotations

from typing import Literal

from vllm_mlx.config.fields import Reload, Section, setting

MAX_QUANTIZED_AFTER = 10_000_000  # past any context length: never quantize


class KVCacheSettings(Section):
    bits: Literal[4, 8] | None = setting(
        None,
        Reload.MODEL,
        "Quantize every request's K and V to this many bits (affine, per group, as MLX "
        "quantizes weights): 8 is near lossless at about half a float16 cache's bytes "
        "(a quarter of float32's); 4 halves that again at a measurable quality cost "
        "(docs/caching.md has the measured table). Unset: full precision.",
    )
    group_size: Literal[32, 64] = setting(
        64,
        Reload.MODEL,
        "Values sharing one scale and bias; 32 is more exact and 1/8 larger at 4 bits. "
        "The model's head dimension must be a multiple of it.",
    )
    quantized_after: int = setting(
        0,
        Reload.MODEL,
        "Tokens kept in full precision before a batch's cache is quantized (mlx-lm's "
        "`quantized_kv_start`). The decision is per batch: a short request sharing a "
        "batch with a long one is quantized with it, so 0 (the default) keeps each "
        "request's output independent of its batch partners.",
        ge=0,
        le=MAX_QUANTIZED_AFTER,
    )
