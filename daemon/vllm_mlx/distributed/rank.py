"""One rank of the group: join it, load this rank's shard, and (ranks > 0) follow rank 0.

Started by mlx.launch (launcher.py), which sets MLX_RANK and the backend's variables.
Rank 0 runs the normal daemon with a sharded model whose scheduler leads; the other
ranks bind nothing and run `follow()` until rank 0 says stop (or reload: then they load
and shard the next model and follow again) or the group fails.
"""

from __future__ import annotations

import functools
import os
import socket
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import structlog
from mlx.utils import tree_flatten

from vllm_mlx.config.distributed import DistributedSettings
from vllm_mlx.config.model import ModelSettings
from vllm_mlx.config.settings import Settings
from vllm_mlx.distributed.lockstep import GROUP_FAILED_EXIT, Channel, Follower, Leader
from vllm_mlx.distributed.status import GroupStatus, set_current
from vllm_mlx.engine.fleet.collector import settle
from vllm_mlx.models.loaded import LoadedModel

log = structlog.get_logger(__name__)

HOST_BYTES = 64
SOURCE_BYTES = 256
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
        self.status.hosts = self._table(socket.gethostname(), HOST_BYTES)
        self.leader: Leader | None = None  # rank 0's, for the model serving now
        if self.channel.rank == 0:
            set_current(self.status)
        structlog.contextvars.bind_contextvars(rank=self.channel.rank)

    @property
    def rank(self) -> int:
        return self.channel.rank

    def _table(self, text: str, width: int) -> list[str]:
        """Every rank's `text` (cut to `width` bytes), on every rank."""
        table = np.zeros((self.channel.size, width), np.uint8)
        data = text.encode()[:width]
        table[self.channel.rank, : len(data)] = np.frombuffer(data, np.uint8)
        rows = np.array(mx.distributed.all_sum(mx.array(table), group=self.channel.group))
        return [bytes(r).rstrip(b"\0").decode(errors="replace") for r in rows]

    def loader(self, base: Loader, settings: Settings) -> Loader:
        """Rank 0: `base` (models.loader.load_model), sharding the one generation model.

        A later call is a model reload (a SIGHUP or a changed model in the file): rank 0
        loads the new model beside the one serving, hands the old engine over (new
        requests get a 503, in-flight ones finish, then every rank is told the new
        settings), and every rank loads and shards it; rank 0 serves on a new Leader.
        """

        def load(model: ModelSettings) -> Any:
            if model.task != "generate":
                return base(model)  # embedding models run on rank 0 alone
            loaded: LoadedModel = base(_float32(model))  # the old model serves meanwhile
            self._check(loaded.model)
            old = self.leader
            if old is not None:
                log.info("re-sharding the group for a new model", model=model.name)
                old.hand_over(reload_message(model, settings))
            try:
                self._shard(loaded.model, model)
            except Exception as exc:
                if old is not None:  # the other ranks moved on: the group is lost
                    old.failed(f"re-sharding {model.name}: {exc}")
                raise
            self.leader = Leader(self.channel, self.settings, self.status)
            self.status.state = "serving"
            return replace(loaded, lockstep=self.leader)

        return load

    def load_shard(self, base: Loader, model: ModelSettings) -> LoadedModel:
        """Ranks > 0: load and shard; a failure to load is told to the others first."""
        try:
            loaded: LoadedModel = base(_float32(model))
            self._check(loaded.model)
        except Exception as exc:
            log.error("cannot load the model", model=model.name, error=str(exc))
            self._agree(ok=False)
            raise
        self._shard(loaded.model, model)
        return loaded

    def _check(self, model: Any) -> None:
        """What would make this model's shards inconsistent, before anything changes."""
        size = self.channel.size
        if self.settings.strategy == "pipeline":
            inner: Any = getattr(model, "model", None)
            if not hasattr(inner, "pipeline"):
                raise ValueError(
                    f"this model ({type(model).__module__}) has no pipeline parallelism in "
                    "mlx-lm; use `strategy: tensor`"
                )
            layers = len(getattr(inner, "layers", []))
            if layers < size:
                raise ValueError(f"pipeline over {size} ranks needs {size} layers, not {layers}")
            return
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

    def _agree(self, ok: bool) -> None:
        """Every rank says whether it loaded the model; raise unless all did."""
        flags = np.zeros(self.channel.size, np.int32)
        flags[self.rank] = 0 if ok else 1
        total = np.array(mx.distributed.all_sum(mx.array(flags), group=self.channel.group))
        failed = [rank for rank, flag in enumerate(total) if flag]
        if failed:
            raise RuntimeError(f"rank(s) {failed} could not load the model (see their log)")

    def _shard(self, model: Any, settings: ModelSettings) -> None:
        self._agree(ok=True)
        if self.settings.strategy == "pipeline":
            model.model.pipeline(self.channel.group)
        else:
            model.shard(self.channel.group)
        mx.eval(model.parameters())
        params: list[tuple[str, Any]] = tree_flatten(model.parameters())  # type: ignore[assignment]
        own = sum(v.nbytes for _, v in params)
        counts = np.zeros(self.channel.size, np.int32)
        counts[self.rank] = own // 1024  # KiB: int32 holds 2 TiB per rank
        # This all_sum is also the barrier that ends loading on every rank together.
        total = mx.distributed.all_sum(mx.array(counts), group=self.channel.group)
        self.status.weight_bytes = [int(v) * 1024 for v in np.array(total)]
        # Each rank's own word for what it loaded (a reload shows here per rank).
        self.status.models = self._table(f"{settings.name} {settings.source}", SOURCE_BYTES)
        self.status.loads += 1
        log.info(
            "model sharded",
            strategy=self.settings.strategy,
            weight_bytes=own,
            ranks=self.channel.size,
        )


def _float32(model: ModelSettings) -> ModelSettings:
    # The quantized CPU kernel swaps in layers mlx-lm's shard does not know.
    return model.model_copy(update={"dtype": "float32" if model.dtype == "auto" else model.dtype})


def reload_message(model: ModelSettings, settings: Settings) -> dict[str, Any]:
    """What the other ranks need to load the next model as rank 0 does."""
    return {
        "model": model.model_dump(mode="json"),
        "engine": settings.engine.model_dump(mode="json"),
        "cache_dir": str(settings.resolved_cache_dir()),
    }


def in_group() -> bool:
    """True in a process mlx.launch started (it sets MLX_RANK)."""
    return "MLX_RANK" in os.environ


def run_follower(rank: Rank, settings: Settings) -> int:
    """Ranks > 0: load the shard, then step in lockstep with rank 0 until told to stop;
    a reload message starts over with the next model."""
    from vllm_mlx.config.sections import EngineSettings
    from vllm_mlx.distributed.follower import follow
    from vllm_mlx.engine.scheduler import Scheduler
    from vllm_mlx.engine.scheduler_state import scheduler_config, with_kv_cache

    (model,) = [m for m in settings.models if m.task == "generate"]
    engine, cache_dir = settings.engine, settings.resolved_cache_dir()
    while True:
        # First, so its watchdog sees the launcher go while this rank loads (unarmed:
        # a load takes as long as it takes).
        follower = Follower(rank.channel, rank.settings)
        try:
            loaded = rank.load_shard(functools.partial(_load, cache_dir, engine), model)
        except Exception as exc:  # this rank's load, or another's (they agree first)
            log.error("the group cannot load the model; this rank exits", error=str(exc))
            return GROUP_FAILED_EXIT
        settle()  # the shard's objects: out of every later full collection's walk
        scheduler = Scheduler(
            loaded.model,
            set(loaded.tokenizer.eos_token_ids),
            # The launcher's engine quantizes its shard's cache the same way.
            with_kv_cache(scheduler_config(engine), model.kv_cache, loaded.model),
            name=f"follower-{rank.rank}",
            lockstep=follower,
        )
        outcome = follow(scheduler, follower, loaded.tokenizer)
        if isinstance(outcome, int):
            return outcome
        model = ModelSettings.model_validate(outcome["model"])
        engine = EngineSettings.model_validate(outcome["engine"])
        cache_dir = Path(outcome["cache_dir"])
        del loaded, scheduler, follower  # the old shard's memory goes before the next loads
        settle()
        log.info("reloading: the next model", model=model.name, source=model.source)


def _load(cache_dir: Path, engine: Any, model: ModelSettings) -> Any:
    from vllm_mlx.models.loader import load_model

    return load_model(model, cache_dir, engine)
