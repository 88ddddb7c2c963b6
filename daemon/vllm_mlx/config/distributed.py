"""The `distributed` section of vllm-mlx.yaml: one model across several processes.

Off by default (`ranks: 1`, no hostfile). Every key needs a restart: the group is
formed once, when `vllm-mlx serve` starts it through mlx.launch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import model_validator

from vllm_mlx.config.fields import Reload, Section, setting

MAX_RANKS = 16


class DistributedSettings(Section):
    backend: Literal["ring", "jaccl", "mpi"] = setting(
        "ring",
        Reload.RESTART,
        "MLX distributed backend: `ring` (TCP; loopback or Ethernet/Thunderbolt IP), "
        "`jaccl` (RDMA over Thunderbolt 5, macOS 26.2+), `mpi` (needs an MPI install).",
    )
    ranks: int = setting(
        1,
        Reload.RESTART,
        "Local ranks on 127.0.0.1 when there is no hostfile; 1 = not distributed. "
        "With tensor parallelism each of the model's attention and KV head counts must "
        "divide by it (SmolLM2-135M: 3, not 2).",
        ge=1,
        le=MAX_RANKS,
    )
    hostfile: Path | None = setting(
        None,
        Reload.RESTART,
        "mlx.launch's JSON hostfile (a list of {ssh, ips}); one rank per entry. Rank 0 "
        "(the first entry) serves HTTP and should be this machine.",
    )
    strategy: Literal["tensor", "pipeline"] = setting(
        "tensor",
        Reload.RESTART,
        "`tensor`: every rank holds 1/N of each layer (mlx-lm's `model.shard`); "
        "`pipeline`: every rank holds 1/N of the layers (only models with "
        "`model.pipeline` in mlx-lm: qwen2, deepseek, glm4_moe and others; llama has none).",
    )
    step_timeout: float = setting(
        30.0,
        Reload.RESTART,
        "Seconds one step or one exchange with the other ranks may take before rank 0 "
        "declares the group dead: it fails every in-flight request, reports unhealthy "
        "and exits 70 (about step_timeout + 1.25 s after a rank dies or hangs). Must "
        "exceed the longest step (a long prefill chunk).",
        gt=0,
        le=3600,
    )
    heartbeat: float = setting(
        1.0,
        Reload.RESTART,
        "Seconds between heartbeat exchanges while idle, so a dead rank is found "
        "without traffic too.",
        gt=0,
        le=60,
    )
    starting_port: int | None = setting(
        None,
        Reload.RESTART,
        "ring: first TCP port (one per rank); null: free ports found at start.",
        ge=1024,
        le=65000,
    )

    @model_validator(mode="after")
    def _consistent(self) -> DistributedSettings:
        if self.hostfile is not None:
            if self.ranks != 1:
                raise ValueError("give either `ranks` (local) or `hostfile`, not both")
            hosts = read_hostfile(self.hostfile)
            if self.backend == "ring" and any(not h.get("ips") for h in hosts):
                raise ValueError("the ring backend needs `ips` for every host in the hostfile")
        if self.backend == "jaccl" and self.hostfile is None and self.ranks > 1:
            raise ValueError("jaccl needs a hostfile (RDMA devices per host); use ring locally")
        return self

    @property
    def enabled(self) -> bool:
        return self.ranks > 1 or self.hostfile is not None

    @property
    def size(self) -> int:
        return len(read_hostfile(self.hostfile)) if self.hostfile is not None else self.ranks


def read_hostfile(path: Path) -> list[dict[str, Any]]:
    """mlx.launch's hostfile: a JSON list (or {"hosts": [...]}) of at least 2 hosts."""
    try:
        data = json.loads(Path(path).expanduser().read_text())
    except OSError as exc:
        raise ValueError(f"cannot read the hostfile {path}: {exc.strerror or exc}") from exc
    except json.JSONDecodeError as exc:
        raise ValueError(f"the hostfile {path} is not JSON: {exc}") from exc
    hosts = data.get("hosts") if isinstance(data, dict) else data
    if not isinstance(hosts, list) or not all(isinstance(h, dict) for h in hosts):
        raise ValueError(f"the hostfile {path} must be a list of {{ssh, ips}} objects")
    if not 2 <= len(hosts) <= MAX_RANKS:
        raise ValueError(f"the hostfile {path} must list 2 to {MAX_RANKS} hosts")
    for i, host in enumerate(hosts):
        if not isinstance(host.get("ssh"), str) or not host["ssh"]:
            raise ValueError(f"hostfile {path}: host {i} has no `ssh` name")
        ips = host.get("ips", [])
        if not isinstance(ips, list) or not all(isinstance(ip, str) for ip in ips):
            raise ValueError(f"hostfile {path}: host {i}: `ips` must be a list of strings")
    return hosts


def check_distributed_models(
    distributed: DistributedSettings, models: list[Any], budgeted: bool
) -> None:
    """A group runs exactly one generation model: every rank steps it in lockstep, and
    two models' collectives on two engine threads would interleave differently on each
    rank. Embedding models stay on rank 0."""
    if not distributed.enabled:
        return
    generators = [m.name for m in models if m.task == "generate"]
    if len(generators) != 1:
        raise ValueError(
            f"`distributed` serves exactly one generation model; `models` has "
            f"{len(generators)} ({', '.join(generators) or 'none'})"
        )
    (model,) = [m for m in models if m.task == "generate"]
    if model.dtype == "quantized":
        raise ValueError(
            "`distributed` models are served as float32 (the quantized CPU kernel does not "
            "shard); set the model's dtype to auto or float32/float16/bfloat16"
        )
    # Every rank loads its shard at start and again only on a reload (every rank then
    # re-shards together, rank.py); a model that unloads (keep_alive, an eviction) or
    # loads on demand would have the group without a model between requests.
    first = models[0] is model
    if model.load == "on_demand" or (model.load is None and not first):
        raise ValueError(
            f"the distributed model {model.name!r} must load at startup (`load: startup`)"
        )
    if model.keep_alive != -1:
        raise ValueError(f"the distributed model {model.name!r} must stay loaded: `keep_alive: -1`")
    if budgeted and not model.pin:
        raise ValueError(
            f"with a memory budget the distributed model {model.name!r} needs `pin: true` "
            "(it cannot be evicted and loaded again)"
        )
