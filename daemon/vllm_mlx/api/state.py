"""What every route handler reads: the current settings and the served models."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from litestar import Request

from vllm_mlx.api.responses.store import ResponseStore
from vllm_mlx.config.settings import Settings
from vllm_mlx.distributed.status import GroupStatus
from vllm_mlx.engine.fleet.registry import ModelRegistry
from vllm_mlx.engine.fleet.residency import ModelManager
from vllm_mlx.mcp.manager import McpManager
from vllm_mlx.metrics.core import Metrics
from vllm_mlx.telemetry.hooks import Tracing
from vllm_mlx.usage.ledger import UsageLedger


@dataclass
class ServerState:
    # Replaced as a whole on hot reload; a request reads it once when it starts and
    # keeps that object, so in-flight requests finish under the settings they began with.
    settings: Settings
    registry: ModelRegistry
    draining: bool = False
    config_path: Path | None = None
    config_loaded_at: float = field(default_factory=time.time)
    config_error: str | None = None  # the last rejected edit of the file, if any
    pending_changes: list[str] = field(default_factory=list)  # need a reload (SIGHUP)
    # Each daemon's own registry: counters survive hot reloads, tests get fresh ones.
    metrics: Metrics = field(default_factory=Metrics)
    # Stored Responses API results (previous_response_id); bounds read per call.
    responses: ResponseStore = field(default_factory=ResponseStore)
    # MCP servers; the daemon applies `settings.mcp` to it at start and on every reload.
    mcp: McpManager = field(init=False)
    # Loads, unloads and the memory budget; the daemon sets it (None in unit tests).
    residency: ModelManager | None = None
    # Rank 0 of a distributed group: the ranks, their times, and whether it failed.
    distributed: GroupStatus | None = None
    # Usage per key (SQLite); the daemon opens it while `usage.enabled` (None: not counted).
    usage: UsageLedger | None = None
    # OpenTelemetry traces; the daemon starts them when an endpoint is set (None: off).
    tracing: Tracing | None = None

    def __post_init__(self) -> None:
        self.mcp = McpManager(self.metrics)

    def config_status(self) -> dict[str, Any]:
        """The config block of /v1/status."""
        return {
            "path": str(self.config_path) if self.config_path else None,
            "loaded_at": self.config_loaded_at,
            "last_error": self.config_error,
            "pending_changes": list(self.pending_changes),
        }


def server_state(request: Request[Any, Any, Any]) -> ServerState:
    """The daemon's state, as the app factory installed it."""
    state: ServerState = request.app.state.server
    return state


# The settings snapshot of one request lives in its ASGI scope under this key.
SETTINGS_KEY = "vllm_mlx.settings"


NOTE_KEY = "vllm_mlx.note"  # a dict in the ASGI scope that handlers add facts to


def open_note(scope: Any) -> dict[str, Any]:
    """A fresh note for this request (the refusal log line reads it); copies of the
    scope share it."""
    note: dict[str, Any] = {}
    cast(dict[str, Any], scope)[NOTE_KEY] = note
    return note


def note_model(scope: Any, model_id: str) -> None:
    """The model the request named, once it is known to be served."""
    note = cast(dict[str, Any], scope).get(NOTE_KEY)
    if isinstance(note, dict):
        note["model"] = model_id


def remember_settings(scope: Any, settings: Settings) -> None:
    """The edge middleware's one read of the settings, kept for everything after it."""
    cast(dict[str, Any], scope)[SETTINGS_KEY] = settings


def request_settings(request: Request[Any, Any, Any]) -> Settings:
    """The settings this request runs under, from start to end: read once (by the edge
    middleware, or here when it did not run), so a hot reload never splits a request
    across two configurations."""
    scope = cast(dict[str, Any], request.scope)
    settings = scope.get(SETTINGS_KEY)
    if settings is None:
        settings = scope[SETTINGS_KEY] = server_state(request).settings
    return cast(Settings, settings)
