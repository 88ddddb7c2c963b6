"""The models one HTTP request holds, released when its response is over.

A context variable carries the list, so tasks a handler creates share it; the API's
ASGI layer opens it around the app (`request_leases`) and releases what was taken
(`release_all`), streamed bodies included.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # no engine (mlx) import at run time: the ASGI layer imports this
    from vllm_mlx.engine.fleet.registry import ModelEntry


class Holder(Protocol):
    def release(self, entry: ModelEntry) -> None: ...


LeaseList = list[tuple[Holder, "ModelEntry"]]
_leases: contextvars.ContextVar[LeaseList | None] = contextvars.ContextVar(
    "model_leases", default=None
)


@contextlib.contextmanager
def request_leases() -> Iterator[LeaseList]:
    """Collect the models a request acquires; tasks created inside share the list.

    The caller releases them (`release_all`) once the response is over.
    """
    held: LeaseList = []
    token = _leases.set(held)
    try:
        yield held
    finally:
        _leases.reset(token)


def current_leases() -> LeaseList | None:
    """The running request's list; None outside a request (nothing would release)."""
    return _leases.get()


def release_all(held: LeaseList) -> None:
    while held:
        holder, entry = held.pop()
        holder.release(entry)
