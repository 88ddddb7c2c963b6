"""LoRA adapters beside a loaded base model, chosen per batch row.

mlx-lm applies an adapter by wrapping each target layer in a `LoRALinear` (or fusing it
into the weights), one adapter per model. Here one base serves many adapters at once:
each target layer keeps the base layer's own class and parameters and gains a bank of
low-rank pairs, one per loaded adapter, and a forward pass adds to each row the delta of
that row's adapter, with mlx-lm's own formula (`y + (scale * ((x @ a) @ b)).astype(x.dtype)`),
so a row computes exactly what mlx-lm computes with that adapter alone. The base weights
are never merged or copied, so the quantized CPU kernel (models/cpu/qmm.py) keeps serving
the base product.

Which row runs which adapter comes from the batch KV cache: the engine tags each row's
cache with its request's adapter (engine/cache/rows.py keeps the `tags` aligned with the
rows through merge, extend and filter), and the routed model reads them at the start of
each forward pass. A pass whose cache has no tags runs `Router.default` on every row.

Only the engine thread calls these (it owns the model's arrays).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
from mlx.nn.layers.linear import Linear
from mlx.nn.layers.quantized import QuantizedLinear


@dataclass(frozen=True)
class LoRAPair:
    """One layer's low-rank update of one adapter: x @ a @ b, times scale."""

    a: mx.array  # (input_dims, rank)
    b: mx.array  # (rank, output_dims)
    scale: float

    @property
    def nbytes(self) -> int:
        return int(self.a.nbytes + self.b.nbytes)

    def delta(self, x: mx.array) -> mx.array:
        # mlx_lm.tuner.lora.LoRALinear.__call__ (dropout is the identity in eval mode).
        z = (x @ self.a) @ self.b
        return (self.scale * z).astype(x.dtype)


@dataclass
class Router:
    """The adapter of each row of the forward pass under way (None: the base)."""

    rows: tuple[Hashable, ...] | None = None
    default: Hashable = None
    tags: set[Hashable] = field(default_factory=set)  # the adapters installed

    def row_tags(self, batch: int) -> tuple[Hashable, ...]:
        if self.rows is not None and len(self.rows) == batch:
            return self.rows
        return (self.default,) * batch

    @contextlib.contextmanager
    def defaulting(self, tag: Hashable) -> Iterator[None]:
        """Untagged passes (a prefill outside the batch) run `tag` meanwhile."""
        previous, self.default = self.default, tag
        try:
            yield
        finally:
            self.default = previous


@dataclass
class LoRABank:
    """A target layer's adapters, by tag."""

    router: Router
    pairs: dict[Hashable, LoRAPair] = field(default_factory=dict)

    def apply(self, x: mx.array, y: mx.array) -> mx.array:
        if not self.pairs:
            return y
        rows = self.router.row_tags(x.shape[0])
        active = [tag for tag in dict.fromkeys(rows) if tag in self.pairs]
        if len(active) == 1 and all(tag == active[0] for tag in rows):
            return y + self.pairs[active[0]].delta(x)
        for tag in active:
            index = mx.array([i for i, row in enumerate(rows) if row == tag])
            # Row by row the same sum as the single-adapter case: y + delta.
            y = y.at[index].add(self.pairs[tag].delta(x[index]))
        return y


@functools.cache
def _banked_class(base: type) -> type:
    """`base` with the bank's delta added to its output (one subclass per layer class)."""

    def call(self: Any, x: mx.array) -> mx.array:
        return self.lora_bank.apply(x, base.__call__(self, x))  # type: ignore[no-any-return]

    return type(f"LoRA{base.__name__}", (base,), {"__call__": call})


@functools.cache
def _routed_class(base: type) -> type:
    """The model class whose forward pass first reads its rows' adapters from the cache."""

    def call(self: Any, inputs: mx.array, *args: Any, **kwargs: Any) -> Any:
        cache = kwargs.get("cache", args[0] if args else None)
        router: Router = self.lora_router
        router.rows = _cache_tags(cache)
        try:
            return base.__call__(self, inputs, *args, **kwargs)
        finally:
            router.rows = None

    return type(base.__name__, (base,), {"__call__": call, "__module__": base.__module__})


def _cache_tags(cache: Sequence[Any] | None) -> tuple[Hashable, ...] | None:
    # The batch cache's `tags` (engine/cache/rows.py), one per row, in row order.
    for layer in cache or ():
        tags = getattr(layer, "tags", None)
        if tags is not None:
            return tuple(tags)
    return None


def router_of(model: Any) -> Router:
    """The model's router, making the model routed on first use (its class changes to a
    subclass; parameters, names and attributes stay as they are)."""
    router = getattr(model, "lora_router", None)
    if isinstance(router, Router):
        return router
    router = Router()
    model.__class__ = _routed_class(type(model))  # type: ignore[arg-type]
    # A plain object, not an array or module: kept out of the parameter tree.
    object.__setattr__(model, "lora_router", router)
    return router


def bank_of(layer: Any, router: Router) -> LoRABank:
    bank = getattr(layer, "lora_bank", None)
    if isinstance(bank, LoRABank):
        return bank
    bank = LoRABank(router)
    layer.__class__ = _banked_class(type(layer))  # type: ignore[arg-type]
    object.__setattr__(layer, "lora_bank", bank)
    return bank


def install(model: Any, tag: Hashable, layers: dict[str, LoRAPair]) -> int:
    """Serve adapter `tag` on the model's layers by full module path; returns its bytes."""
    router = router_of(model)
    modules = dict(model.named_modules())
    for path, pair in layers.items():
        bank_of(modules[path], router).pairs[tag] = pair
    router.tags.add(tag)
    return sum(pair.nbytes for pair in layers.values())


def uninstall(model: Any, tag: Hashable) -> None:
    """Stop serving adapter `tag` (its arrays are freed once no pass holds them)."""
    for _, module in model.named_modules():
        bank = getattr(module, "lora_bank", None)
        if isinstance(bank, LoRABank):
            bank.pairs.pop(tag, None)
    router = getattr(model, "lora_router", None)
    if isinstance(router, Router):
        router.tags.discard(tag)


def installed(model: Any) -> set[Hashable]:
    tags: set[Hashable] = set()
    for _, module in model.named_modules():
        bank = getattr(module, "lora_bank", None)
        if isinstance(bank, LoRABank):
            tags.update(bank.pairs)
    return tags


def adapter_refusal(model: Any, tag: Hashable) -> str | None:
    """Why a request for adapter `tag` cannot run on `model` now (None: it can)."""
    router = getattr(model, "lora_router", None)
    if isinstance(router, Router) and tag in router.tags:
        return None
    return f"the adapter {tag} is not loaded on this model"


@contextlib.contextmanager
def routing(model: Any, tag: Hashable) -> Iterator[None]:
    """Forward passes of `model` without row tags run adapter `tag` meanwhile."""
    router = getattr(model, "lora_router", None)
    if tag is None or not isinstance(router, Router):
        yield
        return
    with router.defaulting(tag):
        yield


def is_linear(module: Any) -> bool:
    return isinstance(module, Linear | QuantizedLinear)
