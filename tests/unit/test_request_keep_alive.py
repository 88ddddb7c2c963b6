"""A request's own keep_alive (Ollama's field): parsed from a number or a Go duration,
applied once the request releases the model, in place of the config's until the next
request sets its own or the model unloads."""

from __future__ import annotations

import asyncio
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.support.fleet import Fleet
from vllm_mlx.api.errors import APIError
from vllm_mlx.api.ollama.keep_alive import FOREVER, parse_keep_alive
from vllm_mlx.config.distributed import DistributedSettings
from vllm_mlx.config.model import MAX_KEEP_ALIVE_S
from vllm_mlx.config.settings import Settings
from vllm_mlx.engine.fleet.registry import LoadState
from vllm_mlx.engine.fleet.residency import ModelManager


@pytest.mark.parametrize(
    ("given_value", "seconds"),
    [
        (None, None),
        (0, 0.0),
        (30, 30.0),
        (2.5, 2.5),
        ("0", 0.0),
        ("45", 45.0),
        ("5m", 300.0),
        ("1h30m", 5400.0),
        ("300ms", 0.3),
        ("1.5h", 5400.0),
        ("2m3.5s", 123.5),
        ("-1", FOREVER),
        ("-5m", FOREVER),
        (-1, FOREVER),
        (MAX_KEEP_ALIVE_S + 1, FOREVER),  # beyond a year: for good, never a huge timer
        ("876000h", FOREVER),
    ],
)
def test_keep_alive_values(given_value: float | str | None, seconds: float | None) -> None:
    parsed = parse_keep_alive(given_value)
    assert parsed is None if seconds is None else parsed == pytest.approx(seconds)


@pytest.mark.parametrize(
    "text", ["", "soon", "5 m", "5mm", "m5", "1d", "nan", "5m-3s", "--5m", "inf", "1e3", "0x10"]
)
def test_what_is_no_duration_is_a_400(text: str) -> None:
    with pytest.raises(APIError) as caught:
        parse_keep_alive(text)
    assert caught.value.status == 400 and caught.value.param == "keep_alive"


@given(st.one_of(st.text(max_size=40), st.floats(allow_nan=True), st.integers()))
def test_any_value_is_seconds_forever_or_a_400(value: str | float) -> None:
    try:
        seconds = parse_keep_alive(value)
    except APIError as exc:
        assert exc.status == 400
        return
    assert seconds is not None
    assert seconds == FOREVER or 0 <= seconds <= MAX_KEEP_ALIVE_S


def _unloaded(fleet: Fleet) -> bool:
    return fleet.entry.state is LoadState.NOT_LOADED


def test_a_request_keep_alive_zero_unloads_once_it_releases() -> None:
    fleet = Fleet(keep_alive=-1)  # the config keeps it for good
    fleet.runner.finish.set()

    async def scenario() -> None:
        fleet.entry.in_flight = 1  # the request holds the model
        fleet.manager.keep_alive_after(fleet.entry, 0)
        assert fleet.entry.state is LoadState.RUNNING  # not while the request runs
        assert fleet.manager.keep_alive(fleet.entry) == 0
        fleet.manager.release(fleet.entry)
        await fleet.mid_teardown()
        assert await fleet.manager.unload(fleet.entry) is False  # the idle unload did it
        assert _unloaded(fleet) and fleet.unloads("idle") == 1
        # One residency only: the next load serves the config's keep_alive again.
        assert fleet.entry.keep_alive_override is None
        assert fleet.manager.keep_alive(fleet.entry) == -1

    asyncio.run(scenario())


def test_a_request_keep_alive_forever_outlasts_the_config() -> None:
    fleet = Fleet(keep_alive=0)  # the config unloads at once

    async def scenario() -> None:
        fleet.entry.in_flight = 1
        fleet.manager.keep_alive_after(fleet.entry, FOREVER)
        fleet.manager.release(fleet.entry)
        assert id(fleet.entry) not in fleet.manager._timers  # no idle timer at all
        assert fleet.entry.state is LoadState.RUNNING
        # A later request that names none goes back to the config's.
        fleet.manager.keep_alive_after(fleet.entry, None)
        await fleet.mid_teardown()
        fleet.runner.finish.set()
        assert await fleet.manager.unload(fleet.entry) is False
        assert _unloaded(fleet)

    asyncio.run(scenario())


def test_an_idle_model_takes_a_new_keep_alive_at_once() -> None:
    """A preload (/api/generate with no prompt) holds nothing: the timer starts now."""
    fleet = Fleet(keep_alive=-1)
    fleet.runner.finish.set()

    async def scenario() -> None:
        fleet.manager.keep_alive_after(fleet.entry, 0)
        await fleet.mid_teardown()
        assert await fleet.manager.unload(fleet.entry) is False
        assert _unloaded(fleet)

    asyncio.run(scenario())


def test_a_distributed_model_ignores_a_request_keep_alive() -> None:
    fleet = Fleet(keep_alive=-1)
    group = Settings(models=[fleet.entry.settings], distributed=DistributedSettings(ranks=2))
    manager = ModelManager(fleet.registry, lambda: group, Fleet.no_loader, lambda _: None)
    stopped = threading.Event()
    fleet.runner.stopping = stopped

    async def scenario() -> None:
        manager.keep_alive_after(fleet.entry, 0)
        assert manager.keep_alive(fleet.entry) == -1
        assert fleet.entry.keep_alive_override is None and id(fleet.entry) not in manager._timers

    asyncio.run(scenario())
    assert not stopped.is_set()
