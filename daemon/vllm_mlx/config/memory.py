"""The `memory` section of vllm-mlx.yaml: one budget for every model the daemon holds.

Built on config_base's Section, setting and Reload, like every section. What counts
against the budget is documented in docs/models.md and computed in engine/fleet/residency.py.
"""

from __future__ import annotations

from pydantic import model_validator

from vllm_mlx.config.fields import Reload, Section, setting


class MemorySettings(Section):
    budget_mb: int | None = setting(
        None,
        Reload.HOT,
        "Most memory, in MiB, that loaded models may hold together: each model's weights, "
        "the KV cache its running requests use and its prefix cache at its bound. A load "
        "that would pass it first unloads the least recently used idle, unpinned models; "
        "if that is not enough the request gets a 503 naming the models that hold the "
        "memory. Null (with budget_percent null): no budget.",
        gt=0,
        strict=True,
    )
    budget_percent: float | None = setting(
        None,
        Reload.HOT,
        "The budget as a fraction of the machine's RAM (0.5: half), the same convention "
        "as the seed's `cache_memory_percent`; use this or budget_mb, not both.",
        gt=0,
        le=1,
    )

    @model_validator(mode="after")
    def _one_budget(self) -> MemorySettings:
        if self.budget_mb is not None and self.budget_percent is not None:
            raise ValueError("set memory.budget_mb or memory.budget_percent, not both")
        return self

    def budget_bytes(self, total_ram: int) -> int | None:
        """The budget in bytes on a machine with `total_ram` bytes; None: unlimited."""
        if self.budget_mb is not None:
            return self.budget_mb * 2**20
        if self.budget_percent is not None:
            return int(total_ram * self.budget_percent)
        return None
