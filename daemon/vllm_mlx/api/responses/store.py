"""The bounded in-memory store of finished responses (`store: true`).

Bounds come from `responses.store_max_entries` and `responses.store_ttl`, read on every
call so a hot reload applies at once. Nothing survives a restart: a client that
continues a conversation after one gets the same 404 as for an evicted response.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class StoredResponse:
    response: dict[str, Any]  # the response object as GET /v1/responses/{id} returns it
    input_items: list[dict[str, Any]]  # this request's own input items, with ids
    # Everything the model saw before this turn's output, for previous_response_id:
    # earlier turns' items, then this request's input items.
    history: list[dict[str, Any]]
    stored_at: float

    @property
    def conversation(self) -> list[dict[str, Any]]:
        """The items a follow-up request continues from: history, then the output."""
        return [*self.history, *self.response["output"]]


class ResponseStore:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()
        self._clock = clock

    def put(
        self,
        response: dict[str, Any],
        input_items: list[dict[str, Any]],
        history: list[dict[str, Any]],
        *,
        max_entries: int,
        ttl: float,
    ) -> None:
        if max_entries <= 0:
            return
        entry = StoredResponse(response, input_items, history, self._clock())
        self._items[response["id"]] = entry
        self._items.move_to_end(response["id"])
        self._evict(max_entries, ttl)

    def get(self, response_id: str, *, max_entries: int, ttl: float) -> StoredResponse | None:
        self._evict(max_entries, ttl)
        return self._items.get(response_id)

    def delete(self, response_id: str) -> bool:
        return self._items.pop(response_id, None) is not None

    def __len__(self) -> int:
        return len(self._items)

    def _evict(self, max_entries: int, ttl: float) -> None:
        # Insertion order is age order, so expired entries are always at the front.
        cutoff = self._clock() - ttl
        while self._items:
            oldest = next(iter(self._items.values()))
            if oldest.stored_at > cutoff and len(self._items) <= max_entries:
                break
            self._items.popitem(last=False)
