"""The daemon's listeners (one Granian server per address) and its model loader."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from granian.constants import Interfaces
from granian.server.embed import Server

from vllm_mlx.config.model import ModelSettings
from vllm_mlx.config.settings import Settings
from vllm_mlx.distributed.launcher import current_rank
from vllm_mlx.engine.fleet.registry import Loaded, Loader
from vllm_mlx.models.draft import draft_settings
from vllm_mlx.models.loader import load_model
from vllm_mlx.runtime.lifecycle import RequestTracker


class ListenerFailedError(RuntimeError):
    """A listener could not bind or stopped with an error."""


@dataclass
class Listener:
    """One Granian server on one address; a reload that moves the address adds one."""

    server: Server
    task: asyncio.Task[None]
    tag: str
    retiring: bool = False
    main: bool = True  # server.host:port (moved by a reload); False: ollama.listen


def model_loader(settings: Settings) -> Loader:
    cache_dir = settings.resolved_cache_dir()
    models = settings.models

    def base(model: ModelSettings) -> Loaded:
        return load_model(model, cache_dir, settings.engine, draft_settings(models, model))

    rank = current_rank()  # rank 0 of a distributed group shards its model
    return base if rank is None else rank.loader(base, settings)


def start_listener(tracker: RequestTracker, app: Any, host: str, port: int, main: bool) -> Listener:
    """Serve `app` on host:port in this event loop; its requests counted by `tracker`."""
    tag = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    server = Server(
        tracker.wrap(app, tag),
        address=host,
        port=port,
        interface=Interfaces.ASGINL,
        log_enabled=False,
        backlog=1024,
    )
    return Listener(server, asyncio.create_task(server.serve()), tag, main=main)
