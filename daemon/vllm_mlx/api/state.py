"""What every route handler reads: the current settings and the served models."""

from __future__ import annotations

from dataclasses import dataclass

from vllm_mlx.config import Settings
from vllm_mlx.engine.registry import ModelRegistry


@dataclass
class ServerState:
    # Replaced as a whole on hot reload; a request reads it once when it starts and
    # keeps that object, so in-flight requests finish under the settings they began with.
    settings: Settings
    registry: ModelRegistry
    draining: bool = False
