"""Who is calling: the key a request presented, what it may do and which models it may use.

The edge (api/edge/middleware.py) sets it for the request before routing; the handler
runs in a copy of that context, so code that names a model (api/pipeline/acquire.py,
the model lists, load/unload) reads it without every call passing it along. No keys
configured: there is no principal and everything is allowed, as before.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from vllm_mlx.api.errors import APIError
from vllm_mlx.config.auth import Scope
from vllm_mlx.engine.fleet.registry import ModelEntry


@dataclass(frozen=True)
class Principal:
    name: str  # the key's name (`api_keys[N]` for the flat list): logged, never the key
    scopes: frozenset[Scope]
    models: frozenset[str] | None = None  # names or aliases; None: every model
    requests_per_minute: int | None = None  # None: auth.rate_limit
    tokens_per_minute: int | None = None  # None or 0: no limit
    tokens_per_day: int | None = None  # quotas; None: none
    tokens_per_month: int | None = None

    def has(self, scope: Scope) -> bool:
        return "admin" in self.scopes or scope in self.scopes

    def may_use(self, name: str, aliases: Sequence[str] = ()) -> bool:
        return self.models is None or bool(self.models & {name, *aliases})


current_principal: contextvars.ContextVar[Principal | None] = contextvars.ContextVar(
    "vllm_mlx_principal", default=None
)


def check_model(model_id: str, name: str, aliases: Sequence[str]) -> None:
    """403 when the calling key may not use this model (named `model_id` by the client)."""
    principal = current_principal.get()
    if principal is None or principal.may_use(name, aliases):
        return
    allowed = ", ".join(sorted(principal.models or ())) or "none"
    raise APIError(
        403,
        f"the API key '{principal.name}' may not use model '{model_id}' (its models: {allowed})",
        "permission",
        code="model_not_allowed",
    )


def visible(entries: Iterable[ModelEntry]) -> list[ModelEntry]:
    """The models the calling key sees in the model lists: those it may use."""
    principal = current_principal.get()
    return [
        e
        for e in entries
        if principal is None or principal.may_use(e.settings.name, e.settings.aliases)
    ]
