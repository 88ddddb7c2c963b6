"""The building blocks of vllm-mlx.yaml's settings: how a field documents itself and
says how a change to it is applied, the frozen section base class, and the YAML file's
data as a settings source. Every section module builds on these."""

from __future__ import annotations

import contextvars
import enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic_settings import PydanticBaseSettingsSource

# The parsed YAML file for the Settings being built right now. load_settings sets it;
# a context variable keeps concurrent loads (the reloader, check-config) apart.
current_file_data: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "current_file_data", default=None
)


class FileDataSource(PydanticBaseSettingsSource):
    """The YAML file's data as a settings source, ranked below the environment."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return (current_file_data.get() or {}).get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(current_file_data.get() or {})


class Reload(enum.StrEnum):
    """How a changed setting reaches a running daemon."""

    HOT = "hot"
    MODEL = "model"
    RESTART = "restart"


def setting(
    default: Any, reload: Reload, description: str, leaf: bool = False, **kwargs: Any
) -> Any:
    """A field that documents itself and says how a change to it is applied; `leaf`: a
    list of small sections documented as one key (not key by key)."""
    extra: dict[str, Any] = {"x-reload": reload.value}
    if leaf:
        extra["x-leaf"] = True
    return Field(default, description=description, json_schema_extra=extra, **kwargs)


class LocatedError(ValueError):
    """A validator's error about a part of its value: `loc` continues the field's key
    path (config/file.py reports it at that part's own line)."""

    def __init__(self, message: str, loc: tuple[str | int, ...]) -> None:
        super().__init__(message)
        self.loc = loc


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
