"""Settings: one frozen object built from YAML, environment and CLI flags.

Precedence is CLI flags > environment (``VLLM_MLX_*``, nested with ``__``) > the YAML
file > built-in defaults. Every field declares how a change to it is applied
(``x-reload`` in the JSON schema): ``hot`` (applied to a running daemon at once),
``model`` (needs the models reloaded, e.g. by SIGHUP) or ``restart`` (needs the
listener rebound).
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from vllm_mlx.config.auth import AuthSettings
from vllm_mlx.config.distributed import DistributedSettings, check_distributed_models
from vllm_mlx.config.fields import (
    FileDataSource,
    LocatedError,
    Reload,
    setting,
)
from vllm_mlx.config.limits import LimitsSettings
from vllm_mlx.config.mcp import McpSettings
from vllm_mlx.config.memory import MemorySettings
from vllm_mlx.config.model import ModelSettings
from vllm_mlx.config.model_checks import check_draft_models, check_unique_model_ids
from vllm_mlx.config.ollama import OllamaSettings, overlaps
from vllm_mlx.config.sections import (
    DefaultsSettings,
    EngineSettings,
    LoggingSettings,
    MetricsSettings,
    PathsSettings,
    ResponsesSettings,
    ServerSettings,
    UsageSettings,
)
from vllm_mlx.config.telemetry import TelemetrySettings

ENV_PREFIX = "VLLM_MLX_"
ENV_NESTED_DELIMITER = "__"


def _default_models() -> list[ModelSettings]:
    return [
        ModelSettings(
            name="smollm2-135m-instruct",
            source="builtin:smollm2-135m-instruct",
            aliases=["default"],
        ),
        ModelSettings(name="all-minilm-l6-v2", source="builtin:all-minilm-l6-v2", task="embed"),
        ModelSettings(name="whisper-tiny-en", source="builtin:whisper-tiny-en", task="transcribe"),
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
    usage: UsageSettings = setting(UsageSettings(), Reload.HOT, "Usage accounting per key.")
    mcp: McpSettings = setting(McpSettings(), Reload.HOT, "MCP servers whose tools models use.")
    memory: MemorySettings = setting(
        MemorySettings(), Reload.HOT, "One memory budget for every loaded model."
    )
    distributed: DistributedSettings = setting(
        DistributedSettings(), Reload.RESTART, "One model across several processes or Macs."
    )
    ollama: OllamaSettings = setting(
        OllamaSettings(), Reload.RESTART, "A second listener on Ollama's port."
    )
    telemetry: TelemetrySettings = setting(
        TelemetrySettings(), Reload.RESTART, "OpenTelemetry traces over OTLP/HTTP."
    )

    @field_validator("models")
    @classmethod
    def _unique_model_ids(cls, models: list[ModelSettings]) -> list[ModelSettings]:
        check_unique_model_ids(models)
        check_draft_models(models)
        return models

    @model_validator(mode="after")
    def _second_listener_apart(self) -> Settings:
        extra = self.ollama.address()
        if extra is not None and overlaps(extra, (self.server.host, self.server.port)):
            raise ValueError(
                f"ollama.listen {self.ollama.listen} is the address server.host and "
                f"server.port already listen on ({self.server.host}:{self.server.port}); "
                f"use another port (Ollama's is 11434)"
            )
        return self

    @model_validator(mode="after")
    def _key_models_served(self) -> Settings:
        served = {i for m in self.models for i in (m.name, *m.aliases)}
        for index, key in enumerate(self.auth.keys):
            for position, name in enumerate(key.models or []):
                if name not in served:
                    raise LocatedError(
                        f"key '{key.name}' names model '{name}', which is not served "
                        f"(served: {', '.join(sorted(served))})",
                        ("auth", "keys", index, "models", position),
                    )
        return self

    @model_validator(mode="after")
    def _quotas_counted(self) -> Settings:
        if self.usage.enabled:
            return self
        for index, key in enumerate(self.auth.keys):
            if key.quota.limited:
                raise LocatedError(
                    f"key '{key.name}' has a quota, and quotas are counted by the usage "
                    "accounting, which usage.enabled: false turns off",
                    ("auth", "keys", index, "quota"),
                )
        return self

    @model_validator(mode="after")
    def _distributed_models(self) -> Settings:
        budgeted = self.memory.budget_mb is not None or self.memory.budget_percent is not None
        check_distributed_models(self.distributed, self.models, budgeted)
        return self

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

    def resolved_state_dir(self) -> Path:
        if self.paths.state_dir is not None:
            return self.paths.state_dir.expanduser()
        return default_state_dir()


def default_cache_dir() -> Path:
    if os.uname().sysname == "Darwin":
        return Path.home() / "Library" / "Caches" / "vllm-mlx"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "vllm-mlx"


def default_state_dir() -> Path:
    if os.uname().sysname == "Darwin":
        return Path.home() / "Library" / "Application Support" / "vllm-mlx"
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "vllm-mlx"
