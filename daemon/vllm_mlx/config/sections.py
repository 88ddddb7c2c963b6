"""The daemon-wide sections of vllm-mlx.yaml (all but `models` and `mcp`)."""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Literal

from pydantic import field_validator, model_validator

from vllm_mlx.config.fields import LocatedError, Reload, Section, setting

# The prefix cache bound per model when none is set (measured in docs/benchmarks.md).
DEFAULT_CACHE_MB = 512


class ServerSettings(Section):
    host: str = setting(
        "127.0.0.1", Reload.RESTART, "IP address to listen on (`0.0.0.0` or `::`: every one)."
    )
    port: int = setting(8000, Reload.RESTART, "TCP port to listen on.", ge=1, le=65535)
    timeout: float = setting(
        600.0,
        Reload.HOT,
        "Upper bound in seconds on one request's total time; on expiry the generation is "
        "aborted (504, or an error event on a stream).",
        gt=0,
    )
    drain_timeout: float = setting(
        30.0,
        Reload.HOT,
        "On SIGTERM, seconds in-flight requests get to finish (new ones are refused with "
        "503) before the rest are aborted and the daemon exits. Keep the service manager's "
        "stop timeout above it (`vllm-mlx service install` does).",
        ge=0,
        le=3600,
    )
    cors_origins: list[str] = setting(
        [],
        Reload.HOT,
        "Browser origins allowed to call the API (CORS), e.g. `https://app.example.com`, "
        "or `*` for any; empty: no CORS headers are sent.",
    )
    allowed_hosts: list[str] = setting(
        [],
        Reload.HOT,
        "Host header values accepted besides the listen address and the loopback names "
        "(`localhost`, `127.0.0.1`, `[::1]`, any port), e.g. `llm.example.com` (any port) "
        "or `llm.example.com:8443`; `*` accepts any. Empty: only those names when bound "
        "to a loopback address (DNS rebinding protection), any host otherwise. Others "
        "get 403.",
    )
    allow_client_chat_templates: bool = setting(
        False,
        Reload.HOT,
        "Let requests supply their own chat template (`chat_template`, or "
        "`chat_template_kwargs.chat_template`). Off: such requests get 400. A template "
        "is a program: rendering one costs CPU up to `limits.prompt_timeout`.",
    )

    dashboard: bool = setting(
        True,
        Reload.HOT,
        "Serve the status page at `/ui` (and send browsers that open `/` there). The "
        "page holds no data itself: it reads `/v1/status` with the key a person types "
        "in. Off: `/ui` is 404 and `/` answers browsers as it answers clients.",
    )

    @field_validator("allowed_hosts")
    @classmethod
    def _usable_hosts(cls, value: list[str]) -> list[str]:
        # A stray space would make an entry silently match nothing.
        for host in value:
            if not host or any(c.isspace() or c in "/@" for c in host):
                raise ValueError(f"not a host name or host:port: {host!r}")
        return value

    @field_validator("host")
    @classmethod
    def _ip_address(cls, value: str) -> str:
        # The listener (Granian) binds IP literals only; a name would fail at serve.
        try:
            ipaddress.ip_address(value)
        except ValueError:
            raise ValueError(
                f"{value!r} is not an IP address; use one, e.g. 127.0.0.1 (this machine "
                f"only), 0.0.0.0 (every IPv4 interface) or :: (every interface)"
            ) from None
        return value


# Routing metadata clients put into the system prompt, which changes per session and so
# breaks every cached prefix after it: Claude Code's first system block is
# `x-anthropic-billing-header: cc_version=2.1.197.<3 hex>; cc_entrypoint=sdk-cli;`.
DEFAULT_CANONICALIZATION = (r"x-anthropic-billing-header:.*",)


class EngineSettings(Section):
    continuous_batching: bool = setting(
        True,
        Reload.MODEL,
        "Batch concurrent requests into shared decode steps. When false, one sequence "
        "runs at a time and the others queue (never refused).",
    )
    max_batch_size: int = setting(
        32, Reload.MODEL, "Most sequences decoded together in one step.", ge=1, le=1024
    )
    prefill_batch_size: int = setting(
        16, Reload.MODEL, "Most prompts processed together in one step.", ge=1, le=1024
    )
    prefill_step_size: int = setting(
        512, Reload.MODEL, "Prompt tokens processed per step per prompt.", ge=16
    )
    max_prefill_stall: float | None = setting(
        3.0,
        Reload.MODEL,
        "While sequences are decoding, each step's prefill chunk is sized to take about "
        "this many decode steps' time, so running streams' gap between tokens stays "
        "within about (1 + this) times their usual one while a long prompt is read; the "
        "prompt gets this / (1 + this) of the time. null: always `prefill_step_size` "
        "tokens (streams stall for a whole chunk). Not applied in a distributed group.",
        ge=0.1,
        le=100,
    )
    stream_interval: int = setting(
        1, Reload.HOT, "Tokens gathered before a streamed chunk is sent.", ge=1, le=1024
    )
    cache_memory_mb: int | None = setting(
        None,
        Reload.MODEL,
        "Most memory each model's prefix cache may hold, in MiB: a hard bound on the "
        "bytes of the cached KV arrays (least recently used out first, before a store; an "
        "entry larger than the bound is not kept). The cache lets a prompt that shares a "
        "prefix with an earlier one (a system prompt, a conversation so far) skip that "
        "part of prefill; see docs/caching.md. 0 = off. null: `cache_memory_percent` "
        "when set, else 512.",
        ge=0,
    )
    cache_memory_percent: float | None = setting(
        None,
        Reload.MODEL,
        "The same per-model bound as a fraction of the machine's RAM (0.05 = 5 percent); "
        "set at most one of this and `cache_memory_mb`. null: not used.",
        gt=0,
        le=1,
    )
    use_paged_cache: bool = setting(
        True,
        Reload.MODEL,
        "Keep the prefix cache as shared 16-token blocks: prompts that extend one system "
        "prompt hold a single copy of its KV; hits are exact to the token. false: one "
        "entry per finished prompt. Models whose KV cache cannot be sliced (sliding "
        "window, state space) always use the latter.",
    )
    disk_cache_mb: int = setting(
        4096,
        Reload.MODEL,
        "Most disk each model's prefix cache may use below its memory (the paged cache's "
        "blocks, written as they are stored, read back on a memory miss, least recently "
        "used out first), in MiB, under `paths.cache_dir`/prefix-cache: so an agent's "
        "prefix seen before a restart is not prefilled again after it. Entries are keyed "
        "by the model's files and dtypes, checksummed, and a bad one is dropped. 0 = off.",
        ge=0,
    )
    prefix_cache_mb: int | None = setting(
        None,
        Reload.MODEL,
        "Deprecated: the former name of `cache_memory_mb`, still honoured when that is "
        "not set. null: not used.",
        ge=0,
    )
    embedding_batch_size: int = setting(
        32,
        Reload.MODEL,
        "Embedding models: most inputs embedded together in one forward pass.",
        ge=1,
        le=1024,
    )
    embedding_batch_tokens: int = setting(
        8192,
        Reload.MODEL,
        "Embedding models: most padded tokens (inputs x the longest) in one forward pass; "
        "a single longer input still runs, alone.",
        ge=16,
    )
    prompt_canonicalization: list[str] = setting(
        list(DEFAULT_CANONICALIZATION),
        Reload.HOT,
        "Regular expressions for volatile lines in system text (Anthropic `system`): a "
        "line one matches in full is removed before templating, so a per-session line "
        "does not break the cached prefix after it. User content is never changed. The "
        "default removes Claude Code's `x-anthropic-billing-header:` line; `[]` turns "
        "it off; a list replaces it (add the default to keep it).",
    )
    kernel_pool: Literal["auto", "conservative", "eager"] = setting(
        "auto",
        Reload.MODEL,
        "The CPU kernel (quantized models on Linux): how eagerly its thread pool splits "
        "the small products of a decode step. `auto` times both policies on the first "
        "model that loads (~0.6 s, once a process) and keeps the faster; `conservative` "
        "keeps small products on one thread and lets idle workers sleep at once (the "
        "better choice when other busy processes share the cores, e.g. two daemons on "
        "one machine); `eager` splits every product and keeps idle workers spinning "
        "~30 us. Changes speed, never tokens. /v1/status `kernel_pool` shows the policy "
        "in force and its measurement.",
    )
    blas: str = setting(
        "auto",
        Reload.RESTART,
        "Linux CPU: the BLAS MLX uses. `auto` loads OpenBLAS when installed (20-40x faster "
        "matmuls than the reference BLAS in the mlx[cpu] wheel), `bundled` keeps the "
        "wheel's own, or a path to a CBLAS/LAPACK shared library. Ignored on macOS.",
        min_length=1,
    )

    @field_validator("prompt_canonicalization")
    @classmethod
    def _patterns_compile(cls, value: list[str]) -> list[str]:
        for index, pattern in enumerate(value):
            try:
                re.compile(pattern)
            except re.error as exc:
                message = f"not a regular expression ({exc}): {pattern!r}"
                raise LocatedError(message, (index,)) from None
        return value

    @model_validator(mode="after")
    def _one_cache_bound(self) -> EngineSettings:
        given = [
            key
            for key in ("cache_memory_mb", "cache_memory_percent", "prefix_cache_mb")
            if getattr(self, key) is not None
        ]
        if len(given) > 1:
            raise LocatedError(
                f"set one prefix cache bound, not {' and '.join(given)} "
                "(prefix_cache_mb is the deprecated name of cache_memory_mb)",
                (given[-1],),
            )
        return self

    def prefix_cache_bytes(self, total_ram: int) -> int:
        """Each model's prefix cache bound in bytes (see `cache_memory_mb`)."""
        if self.cache_memory_percent is not None:
            return int(self.cache_memory_percent * total_ram)
        mb = self.cache_memory_mb if self.cache_memory_mb is not None else self.prefix_cache_mb
        return (DEFAULT_CACHE_MB if mb is None else mb) * 2**20

    @field_validator("blas")
    @classmethod
    def _blas_loads(cls, value: str) -> str:
        from vllm_mlx.models.cpu.blas import check_library

        check_library(value)
        return value


class DefaultsSettings(Section):
    """Sampling defaults for requests that do not set a value themselves."""

    temperature: float = setting(0.7, Reload.HOT, "Sampling temperature.", ge=0, le=2)
    top_p: float = setting(1.0, Reload.HOT, "Nucleus sampling mass.", gt=0, le=1)
    top_k: int = setting(0, Reload.HOT, "Keep only the k most likely tokens (0 = off).", ge=0)
    min_p: float = setting(0.0, Reload.HOT, "Minimum probability relative to the top.", ge=0, le=1)
    repetition_penalty: float = setting(
        1.0, Reload.HOT, "Multiplicative repetition penalty (1.0 = off).", gt=0
    )
    max_tokens: int = setting(
        1024, Reload.HOT, "Tokens generated when a request does not say.", ge=1
    )


class MetricsSettings(Section):
    enabled: bool = setting(
        False, Reload.HOT, "Serve Prometheus metrics at GET /metrics (404 when off)."
    )


class ResponsesSettings(Section):
    """The Responses API's store of finished responses (for previous_response_id)."""

    store_max_entries: int = setting(
        1000,
        Reload.HOT,
        "Most stored responses kept in memory for `previous_response_id` and "
        "GET /v1/responses/{id}; the oldest go first. 0 = store nothing.",
        ge=0,
        le=1_000_000,
    )
    store_ttl: float = setting(
        3600.0,
        Reload.HOT,
        "Seconds a stored response is kept after it was created.",
        gt=0,
    )


class LoggingSettings(Section):
    level: Literal["debug", "info", "warning", "error"] = setting(
        "info", Reload.HOT, "Least severe level written."
    )
    format: Literal["auto", "json", "console"] = setting(
        "auto",
        Reload.HOT,
        "`json` lines, human `console` lines, or `auto`: console on a terminal, json "
        "otherwise (launchd, journald).",
    )


class PathsSettings(Section):
    cache_dir: Path | None = setting(
        None,
        Reload.MODEL,
        "Where imported GGUF models are kept; default: the platform cache directory "
        "(~/Library/Caches/vllm-mlx on macOS, $XDG_CACHE_HOME/vllm-mlx on Linux).",
    )
    state_dir: Path | None = setting(
        None,
        Reload.RESTART,
        "Where the daemon keeps what must outlive it (the usage database); default: "
        "~/Library/Application Support/vllm-mlx on macOS, $XDG_STATE_HOME/vllm-mlx "
        "(~/.local/state/vllm-mlx) on Linux.",
    )


class UsageSettings(Section):
    """Usage accounting: per key, model, route and day, in SQLite (docs/operations.md)."""

    enabled: bool = setting(
        True,
        Reload.HOT,
        "Count requests and tokens per key, model, route and day in `usage.sqlite3` under "
        "`paths.state_dir` (GET /v1/usage, `vllm-mlx keys usage`, the `key` label on "
        "/metrics). Key quotas need it.",
    )
    retention_days: int = setting(
        400,
        Reload.HOT,
        "Days of usage kept; older days are deleted at start and once a day.",
        ge=1,
        le=100_000,
    )
