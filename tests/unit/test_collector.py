"""The collector's settle (engine/fleet/collector.py): what is alive after a model load is
frozen out of every later full collection's walk, and an unloaded model's cycles are
still freed by the next settle. The model manager settles after each load and unload."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Iterator

import pytest

from tests.support.fleet import BlockingRunner, Fleet
from vllm_mlx.engine.fleet import collector
from vllm_mlx.engine.fleet.registry import Loader, LoadState, ModelEntry


class Node:
    """A cycle-capable object a weak reference can watch."""

    def __init__(self) -> None:
        self.other: Node | None = None


@pytest.fixture(autouse=True)
def unfrozen() -> Iterator[None]:
    """Every test leaves the interpreter as pytest runs it: nothing frozen."""
    yield
    gc.unfreeze()


def cycle() -> weakref.ref[Node]:
    a, b = Node(), Node()
    a.other, b.other = b, a
    return weakref.ref(a)


def test_settle_freezes_what_is_alive_so_a_full_pass_skips_it() -> None:
    kept = [Node() for _ in range(1000)]
    frozen = collector.settle()
    assert frozen == gc.get_freeze_count() and frozen >= len(kept)
    walked = {id(o) for o in gc.get_objects()}
    assert not any(id(node) in walked for node in kept)


def test_a_frozen_cycle_is_freed_by_the_next_settle_not_before() -> None:
    watched = cycle()  # garbage once created, but kept from collection by the freeze
    gc.freeze()
    gc.collect()
    assert watched() is not None  # frozen: a full pass does not look at it
    collector.settle()
    assert watched() is None


def test_the_model_manager_settles_after_a_load_and_an_unload(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fleet = Fleet()
    settled: list[LoadState] = []
    monkeypatch.setattr(
        "vllm_mlx.engine.fleet.residency.settle", lambda: settled.append(fleet.entry.state)
    )
    monkeypatch.setattr(
        "vllm_mlx.engine.fleet.footprint.settle", lambda: settled.append(fleet.entry.state)
    )

    def load_entry(entry: ModelEntry, loader: Loader) -> None:
        entry.embedder, entry.state = BlockingRunner(), LoadState.RUNNING  # type: ignore[assignment]

    monkeypatch.setattr(fleet.registry, "load_entry", load_entry)
    fleet.runner.finish.set()

    async def scenario() -> None:
        assert await fleet.manager.unload(fleet.entry)
        await fleet.manager.load_ready(fleet.entry)

    asyncio.run(scenario())
    # Once in the unload's teardown (the model detached), once after the load.
    assert settled == [LoadState.UNLOADING, LoadState.RUNNING]
