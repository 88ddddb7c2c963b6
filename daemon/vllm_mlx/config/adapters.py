"""`models[].adapters`: LoRA adapters served beside a generation model (docs/adapters.md)."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import field_validator

from vllm_mlx.config.fields import Reload, Section, setting
from vllm_mlx.models.adapters import AdapterError, check_adapter_dir

# `base:adapter` is an id too, so an adapter's own name never holds the separator.
_NAME = re.compile(r"^[^\s:]+$")


class AdapterSettings(Section):
    """One mlx-lm adapter directory (`adapter_config.json` + `adapters.safetensors`, as
    `mlx_lm.lora` writes them), served under its own model id."""

    name: str = setting(
        ...,
        Reload.HOT,
        "The adapter's model id (also reachable as `<base name>:<name>`); no spaces or `:`.",
        min_length=1,
    )
    path: Path = setting(
        ...,
        Reload.HOT,
        "The adapter directory (relative paths: from the daemon's working directory).",
    )

    @field_validator("name")
    @classmethod
    def _plain_name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError(f"adapter name {value!r} must have no spaces and no `:`")
        return value

    @field_validator("path")
    @classmethod
    def _adapter_dir(cls, value: Path) -> Path:
        path = value.expanduser()
        try:
            check_adapter_dir(path)
        except AdapterError as exc:
            raise ValueError(str(exc)) from exc
        return path


def adapter_ids(base: str, adapter: AdapterSettings) -> tuple[str, str]:
    """The ids that reach an adapter: its name and `base:name`."""
    return adapter.name, f"{base}:{adapter.name}"
