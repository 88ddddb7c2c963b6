"""Checks across the `models` list (ids unique, drafts that exist): each error points at
the key that causes it."""

from __future__ import annotations

from collections.abc import Sequence

from vllm_mlx.config.adapters import adapter_ids
from vllm_mlx.config.fields import LocatedError
from vllm_mlx.config.model import ModelSettings
from vllm_mlx.models.sources import check_source


def check_unique_model_ids(models: list[ModelSettings]) -> None:
    """Raise LocatedError at the first name or alias already used by an earlier model."""
    seen: dict[str, int] = {}
    for index, model in enumerate(models):
        ids: list[tuple[str, tuple[str | int, ...]]] = [(model.name, (index, "name"))]
        ids += [(alias, (index, "aliases", n)) for n, alias in enumerate(model.aliases)]
        ids += [
            (adapter_id, (index, "adapters", n, "name"))
            for n, adapter in enumerate(model.adapters)
            for adapter_id in adapter_ids(model.name, adapter)
        ]
        for model_id, loc in ids:
            if model_id in seen:
                first = seen[model_id]
                owner = "this model" if first == index else f"models[{first}]"
                raise LocatedError(
                    f"model id {model_id!r} is already used by {owner} "
                    f"({models[first].name!r}); names and aliases must be unique",
                    loc,
                )
            seen[model_id] = index


def named_model(models: Sequence[ModelSettings], name: str) -> ModelSettings | None:
    """The configured model a `draft_model` names (by name or alias), if any."""
    for model in models:
        if name == model.name or name in model.aliases:
            return model
    return None


def check_draft_models(models: Sequence[ModelSettings]) -> None:
    """Raise LocatedError at a `draft_model` that is neither a configured generation
    model nor a source that can be served."""
    for index, model in enumerate(models):
        name = model.speculative.draft_model
        if model.speculative.method != "draft" or name is None:
            continue
        where = (index, "speculative", "draft_model")
        named = named_model(models, name)
        if named is not None:
            if named.task != "generate":
                raise LocatedError(
                    f"draft_model {name!r} is a `task: {named.task}` model; a draft "
                    "generates text (task: generate)",
                    where,
                )
            continue
        try:
            check_source(name)
        except ValueError as exc:
            served = ", ".join(m.name for m in models)
            raise LocatedError(
                f"draft_model {name!r} is neither a model in `models` ({served}) nor a "
                f"source that can be served: {exc}",
                where,
            ) from exc
