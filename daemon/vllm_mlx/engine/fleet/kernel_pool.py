"""The CPU kernel's pool policy for /v1/status, read here so api/ never imports mlx."""

from __future__ import annotations

from typing import Any

from vllm_mlx.models.cpu import pool_policy


def kernel_pool_status() -> dict[str, Any] | None:
    """The policy in force, how it was chosen (measured or `engine.kernel_pool`) and the
    measurement's milliseconds a step per block; None when no model runs on the kernel."""
    return pool_policy.describe()
