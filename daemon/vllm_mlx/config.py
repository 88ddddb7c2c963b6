"""Settings: one frozen object built from YAML, environment and CLI flags.

Precedence is CLI flags > environment (``VLLM_MLX_*``, nested with ``__``) > the YAML
file > built-in defaults. Every field declares how a change to it is applied
(``x-reload`` in the JSON schema): ``hot`` (applied to a running daemon at once),
``model`` (needs the models reloaded, e.g. by SIGHUP) or ``restart`` (needs the
listener rebound).
"""

from __future__ import annotations

import contextvars
import enum
import ipaddress
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from vllm_mlx.models.sources import check_source

ENV_PREFIX = "VLLM_MLX_"
ENV_NESTED_DELIMITER = "__"

# The parsed YAML file for the Settings being built right now. load_settings sets it;
# a context variable keeps concurrent loads (the reloader, check-config) apart.
current_file_data: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "current_file_data", default=None
)


class FileDataSource(PydanticBaseSettingsSource):
    """The YAML file's data as a settings source, ranked below the environment."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return (current_file_data.get() or {}).get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(current_file_data.get() or {})


class Reload(enum.StrEnum):
    """How a changed setting reaches a running daemon."""

    HOT = "hot"
    MODEL = "model"
    RESTART = "restart"


def setting(default: Any, reload: Reload, description: str, **kwargs: Any) -> Any:
    """A field that documents itself and says how a change to it is applied."""
    return Field(
        default,
        description=description,
        json_schema_extra={"x-reload": reload.value},
        **kwargs,
    )


class LocatedError(ValueError):
    """A validator's error about a part of its value: `loc` continues the field's key
    path (configfile.py reports it at that part's own line)."""

    def __init__(self, message: str, loc: tuple[str | int, ...]) -> None:
        super().__init__(message)
        self.loc = loc


def check_unique_model_ids(models: list[ModelSettings]) -> None:
    """Raise LocatedError at the first name or alias already used by an earlier model."""
    seen: dict[str, int] = {}
    for index, model in enumerate(models):
        ids: list[tuple[str, tuple[str | int, ...]]] = [(model.name, (index, "name"))]
        ids += [(alias, (index, "aliases", n)) for n, alias in enumerate(model.aliases)]
        for model_id, loc in ids:
            if model_id in seen:
                first = seen[model_id]
                owner = "this model" if first == index else f"models[{first}]"
                raise LocatedError(
                    f"model id {model_id!r} is already used by {owner} "
                    f"({models[first].name!r}); names and aliases must be unique",
                    loc,
                )
            seen[model_id] = index


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# The mcp section lives beside the MCP code; it builds on the types above.
from vllm_mlx.mcp.settings import McpSettings  # noqa: E402


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


class ModelSettings(Section):
    name: str = setting(..., Reload.MODEL, "The id clients send as `model`.", min_length=1)
    source: str = setting(
        ...,
        Reload.MODEL,
        "Where the weights come from: a Hugging Face repo id (`org/name`), a local mlx-lm "
        "model directory, a local `.gguf` file, or `builtin:smollm2-135m-instruct`.",
        min_length=1,
    )
    aliases: list[str] = setting([], Reload.HOT, "Other ids that reach this model.")
    task: Literal["generate", "embed"] = setting(
        "generate",
        Reload.MODEL,
        "`generate`: a chat/completion model (mlx-lm); `embed`: a sentence-embedding "
        "model served on /v1/embeddings (a BERT encoder, e.g. "
        "`builtin:all-minilm-l6-v2`). See docs/embeddings.md.",
    )
    pooling: Literal["mean", "cls", "last"] | None = setting(
        None,
        Reload.MODEL,
        "Embedding models: how token vectors become one vector; default: the model's "
        "own sentence-transformers pooling config, else `mean`.",
    )
    normalize: bool = setting(
        True, Reload.MODEL, "Embedding models: scale every vector to unit length."
    )
    matryoshka: bool = setting(
        False,
        Reload.HOT,
        "Embedding models trained Matryoshka-style: requests may ask for fewer "
        "`dimensions` (the vector is truncated and re-normalised); otherwise that is a 400.",
    )
    revision: str | None = setting(
        None, Reload.MODEL, "Hugging Face revision (branch, tag or commit) for hub sources."
    )
    context_length: int | None = setting(
        None,
        Reload.MODEL,
        "Largest prompt + completion in tokens (embedding models: the longest input); "
        "default: the model's own maximum.",
        gt=0,
    )
    dtype: Literal["auto", "float32", "float16", "bfloat16", "quantized"] = setting(
        "auto",
        Reload.MODEL,
        "Weight format served: `quantized` keeps the stored weights; `auto` picks by "
        "backend (on the Linux CPU: the stored 4/8-bit weights through the built quantized "
        "kernel; without the kernel, float32 when an optimized BLAS is loaded, which decodes "
        "several times faster than MLX's own CPU quantized matmul; otherwise the stored "
        "format). `vllm-mlx models` shows the path each model takes. See docs/benchmarks.md.",
    )

    enable_auto_tool_choice: bool = setting(
        False,
        Reload.HOT,
        "Parse tool calls out of the model's output (needs `tool_call_parser`). Without it, "
        "requests with tools still render them in the chat template, but calls come back "
        "as plain content.",
    )
    tool_call_parser: str | None = setting(
        None, Reload.HOT, "Tool-call format of this model (docs/tool-calling.md lists them)."
    )
    reasoning_parser: str | None = setting(
        None, Reload.HOT, "Reasoning format of this model: `qwen3` or `deepseek_r1`."
    )
    mcp_tools: Literal["none", "offer", "execute"] = setting(
        "none",
        Reload.HOT,
        "MCP tools in chat and messages requests: `offer` adds the allowed MCP tools to the "
        "tools a request offers (the request's own win on a name clash); `execute` also "
        "runs the model's MCP tool calls in the daemon and generates again (docs/mcp.md).",
    )
    structured_outputs: Literal["llguidance", "off"] = setting(
        "llguidance",
        Reload.HOT,
        "Constrained decoding for `response_format` JSON schemas, regex/choice/grammar "
        "requests and forced tool calls (docs/structured-outputs.md): `llguidance` masks "
        "each token with a grammar; `off` refuses such requests with a 400 and forced tool "
        "choices fall back to prompting.",
    )

    @field_validator("source")
    @classmethod
    def _source_exists(cls, value: str) -> str:
        check_source(value)
        return value

    @field_validator("structured_outputs", mode="before")
    @classmethod
    def _yaml_off(cls, value: Any) -> Any:
        # YAML 1.1 reads a bare `off` as false (and `on` as true).
        if isinstance(value, bool):
            return "llguidance" if value else "off"
        return value

    @field_validator("tool_call_parser")
    @classmethod
    def _known_tool_parser(cls, value: str | None) -> str | None:
        from vllm_mlx.parsers.tool_calls import tool_call_parser_names

        if value is not None and value not in tool_call_parser_names():
            raise ValueError(
                f"unknown tool_call_parser {value!r}; valid: {', '.join(tool_call_parser_names())}"
            )
        return value

    @field_validator("reasoning_parser")
    @classmethod
    def _known_reasoning_parser(cls, value: str | None) -> str | None:
        from vllm_mlx.parsers.reasoning import reasoning_parser_names

        if value is not None and value not in reasoning_parser_names():
            raise ValueError(
                f"unknown reasoning_parser {value!r}; valid: {', '.join(reasoning_parser_names())}"
            )
        return value

    @model_validator(mode="after")
    def _auto_tool_choice_needs_parser(self) -> ModelSettings:
        if self.enable_auto_tool_choice and self.tool_call_parser is None:
            raise ValueError("enable_auto_tool_choice needs tool_call_parser (e.g. `auto`)")
        if self.mcp_tools != "none" and not self.enable_auto_tool_choice:
            raise ValueError(
                f"mcp_tools: {self.mcp_tools} needs enable_auto_tool_choice and a "
                "tool_call_parser (the model's calls must be parsed to reach MCP servers)"
            )
        return self


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
    stream_interval: int = setting(
        1, Reload.HOT, "Tokens gathered before a streamed chunk is sent.", ge=1, le=1024
    )
    prefix_cache_mb: int = setting(
        512,
        Reload.MODEL,
        "Memory for the prefix cache, per model: KV caches of finished requests are kept "
        "(least recently used first out) so a prompt that shares a prefix with an earlier "
        "one (a system prompt, a conversation so far) skips that part of prefill. 0 = off.",
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
    blas: str = setting(
        "auto",
        Reload.RESTART,
        "Linux CPU: the BLAS MLX uses. `auto` loads OpenBLAS when installed (20-40x faster "
        "matmuls than the reference BLAS in the mlx[cpu] wheel), `bundled` keeps the "
        "wheel's own, or a path to a CBLAS/LAPACK shared library. Ignored on macOS.",
        min_length=1,
    )

    @field_validator("blas")
    @classmethod
    def _blas_loads(cls, value: str) -> str:
        from vllm_mlx.blas import check_library

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


class AuthSettings(Section):
    api_keys: list[str] = setting(
        [],
        Reload.HOT,
        "Keys accepted on every /v1 route, sent as `Authorization: Bearer KEY` or "
        "`x-api-key: KEY`; empty: the API is open.",
    )
    rate_limit: int = setting(
        0,
        Reload.HOT,
        "Requests per minute per client on /v1 routes (the API key when one is sent, else "
        "the peer address); over it: 429 with Retry-After. 0 = off.",
        ge=0,
    )
    metrics_require_key: bool = setting(
        False,
        Reload.HOT,
        "Require an API key on /metrics too (it is open by default, like /health).",
    )

    @field_validator("api_keys")
    @classmethod
    def _usable_keys(cls, value: list[str]) -> list[str]:
        for key in value:
            if not key or key != key.strip() or any(c.isspace() for c in key):
                raise ValueError("API keys must be non-empty and contain no whitespace")
        return value


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


def _default_models() -> list[ModelSettings]:
    return [
        ModelSettings(
            name="smollm2-135m-instruct",
            source="builtin:smollm2-135m-instruct",
            aliases=["default"],
        ),
        ModelSettings(name="all-minilm-l6-v2", source="builtin:all-minilm-l6-v2", task="embed"),
    ]


class Settings(BaseSettings):
    """The whole configuration of the daemon, frozen once built."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=ENV_NESTED_DELIMITER,
        extra="forbid",
        frozen=True,
        nested_model_default_partial_update=False,
    )

    server: ServerSettings = setting(ServerSettings(), Reload.HOT, "Listener and request bounds.")
    models: list[ModelSettings] = Field(
        default_factory=_default_models,
        description="The models served, each with its name, source and aliases.",
        json_schema_extra={"x-reload": Reload.MODEL.value},
        min_length=1,
    )
    engine: EngineSettings = setting(EngineSettings(), Reload.HOT, "Batching and streaming.")
    defaults: DefaultsSettings = setting(DefaultsSettings(), Reload.HOT, "Sampling defaults.")
    limits: LimitsSettings = setting(LimitsSettings(), Reload.HOT, "Per-request bounds.")
    auth: AuthSettings = setting(AuthSettings(), Reload.HOT, "API keys and rate limits.")
    metrics: MetricsSettings = setting(MetricsSettings(), Reload.HOT, "Prometheus metrics.")
    responses: ResponsesSettings = setting(
        ResponsesSettings(), Reload.HOT, "The Responses API's response store."
    )
    logging: LoggingSettings = setting(LoggingSettings(), Reload.HOT, "Log level and format.")
    paths: PathsSettings = setting(PathsSettings(), Reload.MODEL, "Where files are kept.")
    mcp: McpSettings = setting(McpSettings(), Reload.HOT, "MCP servers whose tools models use.")

    @field_validator("models")
    @classmethod
    def _unique_model_ids(cls, models: list[ModelSettings]) -> list[ModelSettings]:
        check_unique_model_ids(models)
        return models

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # init_settings carries the CLI flags: CLI > env > file > defaults.
        return (init_settings, env_settings, FileDataSource(settings_cls))

    def resolved_cache_dir(self) -> Path:
        if self.paths.cache_dir is not None:
            return self.paths.cache_dir.expanduser()
        return default_cache_dir()


def default_cache_dir() -> Path:
    if os.uname().sysname == "Darwin":
        return Path.home() / "Library" / "Caches" / "vllm-mlx"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "vllm-mlx"
