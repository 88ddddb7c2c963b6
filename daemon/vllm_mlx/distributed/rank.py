"""One rank of the group: join it, load this rank's shard, and (ranks > 0) follow rank 0.

Started by mlx.launch (launcher.py), which sets MLX_RANK and the backend's variables.
Rank 0 runs the normal daemon with a sharded model whose scheduler leads; the other
ranks bind nothing and run `follow()` until rank 0 says stop or the group fails.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import mlx.core as mx
import numpy as np
import structlog
from mlx.utils import tree_flatten

from vllm_mlx.config import ModelSettings, Settings
from vllm_mlx.distributed.lockstep import Channel, Follower, Leader
from vllm_mlx.distributed.settings import DistributedSettings
from vllm_mlx.distributed.status import GroupStatus, set_current
from vllm_mlx.models.loaded import LoadedModel

log = structlog.get_logger(__name__)

HOST_BYTES = 64
# Config keys a tensor-parallel shard splits: each must divide by the group size.
_SPLIT_KEYS = ("num_attention_heads", "num_key_value_heads", "intermediate_size")

Loader = Callable[[ModelSettings], Any]


class Rank:
    """This process's place in the group."""

    def __init__(self, settings: DistributedSettings) -> None:
        self.settings = settings
        group = mx.distributed.init(strict=True, backend=settings.backend)
        self.channel = Channel(group)
        self.status = GroupStatus(
            self.channel.rank, self.channel.size, settings.backend, settings.strategy
        )
        self.status.hosts = self._hosts()
        self.loaded = False
        if self.channel.rank == 0:
            set_current(self.status)
        structlog.contextvars.bind_contextvars(rank=self.channel.rank)

    @property
    def rank(self) -> int:
        return self.channel.rank

    def _hosts(self) -> list[str]:
        table = np.zeros((self.channel.size, HOST_BYTES), np.uint8)
        name = socket.gethostname().encode()[:HOST_BYTES]
        table[self.channel.rank, : len(name)] = np.frombuffer(name, np.uint8)
        rows = np.array(mx.distributed.all_sum(mx.array(table), group=self.channel.group))
        return [bytes(r).rstrip(b"\0").decode(errors="replace") for r in rows]

    def loader(self, base: Loader) -> Loader:
        """`base` (models.loader.load_model), sharding the one generation model."""

        def load(model: ModelSettings) -> Any:
            if model.task != "generate":
                return base(model)  # embedding models run on rank 0 alone
            if self.loaded:
                raise RuntimeError(
                    "a distributed group loads its model once; restart the group "
                    "(the service) to change or reload it"
                )
            dtype = "float32" if model.dtype == "auto" else model.dtype
            loaded: LoadedModel = base(model.model_copy(update={"dtype": dtype}))
            self._shard(loaded.model)
            self.loaded = True
            self.status.state = "serving"
            lockstep = Leader(self.channel, self.settings, self.status) if self.rank == 0 else None
            return replace(loaded, lockstep=lockstep)

        return load

    def _shard(self, model: Any) -> None:
        size = self.channel.size
        if self.settings.strategy == "pipeline":
            inner: Any = getattr(model, "model", None)
            if not hasattr(inner, "pipeline"):
                raise ValueError(
                    f"this model ({type(model).__module__}) has no pipeline parallelism in "
                    "mlx-lm; use `strategy: tensor`"
                )
            inner.pipeline(self.channel.group)
        else:
            if not hasattr(model, "shard"):
                raise ValueError("this model has no tensor parallelism in mlx-lm (no shard())")
            args = getattr(model, "args", None)
            for key in _SPLIT_KEYS:
                value = getattr(args, key, None)
                if isinstance(value, int) and value % size:
                    raise ValueError(
                        f"tensor parallelism over {size} ranks needs the model's {key} "
                        f"({value}) to divide by {size}"
                    )
            model.shard(self.channel.group)
        mx.eval(model.parameters())
        params: list[tuple[str, Any]] = tree_flatten(model.parameters())  # type: ignore[assignment]
        own = sum(v.nbytes for _, v in params)
        counts = np.zeros(size, np.int32)
        counts[self.rank] = own // 1024  # KiB: int32 holds 2 TiB per rank
        # This all_sum is also the barrier that ends loading on every rank together.
        total = mx.distributed.all_sum(mx.array(counts), group=self.channel.group)
        self.status.weight_bytes = [int(v) * 1024 for v in np.array(total)]
        log.info("model sharded", strategy=self.settings.strategy, weight_bytes=own, ranks=size)


def in_group() -> bool:
    """True in a process mlx.launch started (it sets MLX_RANK)."""
    return "MLX_RANK" in os.environ


def run_follower(rank: Rank, settings: Settings) -> int:
    """Ranks > 0: load the shard, then step in lockstep with rank 0 until told to stop."""
    from vllm_mlx.distributed.follower import follow
    from vllm_mlx.engine.scheduler import Scheduler
    from vllm_mlx.engine.scheduler_state import scheduler_config
    from vllm_mlx.models.loader import load_model

    cache_dir = settings.resolved_cache_dir()
    (model,) = [m for m in settings.models if m.task == "generate"]
    loaded = rank.loader(lambda m: load_model(m, cache_dir, settings.engine))(model)
    follower = Follower(rank.channel, rank.settings)
    scheduler = Scheduler(
        loaded.model,
        set(loaded.tokenizer.eos_token_ids),
        scheduler_config(settings.engine),
        name=f"follower-{rank.rank}",
        forced_tokens=None,  # rank 0's tokens arrive with every step
        lockstep=follower,
    )
    return follow(scheduler, follower, loaded.tokenizer)
