"""`limits:` the per-request bounds (hot): tokens, bodies, prompts, choices, rerank
documents, images and audio."""

from __future__ import annotations

from vllm_mlx.config.fields import Reload, Section, setting
from vllm_mlx.config.images import ImageFetchSettings


class LimitsSettings(Section):
    max_request_tokens: int = setting(
        32768,
        Reload.HOT,
        "Most new tokens one request may ask for; larger `max_tokens` values are lowered "
        "to this (and to what the context has room for).",
        ge=1,
    )
    max_body_mb: float = setting(
        32.0,
        Reload.HOT,
        "Largest request body in MiB; larger ones get 413 before they are read.",
        gt=0,
        le=4096,
    )
    max_rerank_documents: int = setting(
        1000,
        Reload.HOT,
        "Most documents one rerank request (or text pairs one /score request) may carry; "
        "more gets 400.",
        ge=1,
    )
    image_fetch: ImageFetchSettings = setting(
        ImageFetchSettings(),
        Reload.HOT,
        "Fetching `http(s)://` image URLs: `allowed`, `max_bytes`, `timeout`, "
        "`max_redirects`, `allow_private_addresses` (docs/vision.md).",
    )
    max_images_per_request: int = setting(
        16,
        Reload.HOT,
        "Most images one request may carry (every message together); more gets 400.",
        ge=1,
    )
    max_image_pixels: int = setting(
        50_000_000,
        Reload.HOT,
        "Most pixels (width x height) one image may have, checked from its header before "
        "it is decoded (decompression bombs); more gets 400.",
        ge=1,
    )
    max_prompt_chars: int = setting(
        8_000_000,
        Reload.HOT,
        "Most characters of text (every string in the JSON body together) one request "
        "may carry; more gets 413 before anything is tokenised.",
        ge=1,
    )
    prompt_timeout: float = setting(
        60.0,
        Reload.HOT,
        "Seconds rendering the chat template and tokenising a prompt may take (off the "
        "event loop, in a worker thread); longer gets 413.",
        gt=0,
    )
    max_n: int = setting(
        8,
        Reload.HOT,
        "Most choices (OpenAI `n`) one request may ask for. The choices share one prefill "
        "but each holds its own KV cache and takes a decode slot.",
        ge=1,
        le=128,
    )
    max_prompts: int = setting(
        64,
        Reload.HOT,
        "Most prompts one /v1/completions request may batch (`prompt` as an array of "
        "strings or of token-id arrays); each prompt's `n` choices count as sequences. "
        "They queue for decode slots like separate requests.",
        ge=1,
        le=1024,
    )
    max_audio_mb: float = setting(
        25.0,
        Reload.HOT,
        "Largest audio file one transcription or translation request may upload, in MiB "
        "(OpenAI's bound); larger gets 413 before it is decoded. The body must also fit "
        "`max_body_mb`.",
        gt=0,
    )
    max_audio_seconds: float = setting(
        3600.0,
        Reload.HOT,
        "Longest audio one transcription or translation request may carry, in seconds of "
        "decoded sound (30 s windows); longer gets 400.",
        gt=0,
    )
