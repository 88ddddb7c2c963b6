"""A consumer cancelled as its next event arrives still leaves, and frees its slot.

On Python 3.11, asyncio.wait_for swallows a cancellation that lands in the loop turn
after its inner wait completes (CPython gh-86296). The engine's per-event wait used it,
so now and then a client that hung up just as a token arrived kept its generation
running to max_tokens. This drives Engine.events with a stand-in scheduler (the real
one needs a model thread; only the asyncio side is under test) and cancels the consumer
at every loop turn around an event's arrival.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from vllm_mlx.engine.engine import Engine
from vllm_mlx.engine.types import EngineEvent, FinishReason, GenerationRequest, TokensGenerated


class RecordingScheduler:
    def __init__(self) -> None:
        self.sink: Any = None
        self.submitted = asyncio.Event()
        self.aborted: list[tuple[str, FinishReason]] = []

    def submit(self, request: GenerationRequest, sink: Any) -> None:
        self.sink = sink
        self.submitted.set()

    def abort(self, request_id: str, reason: FinishReason) -> None:
        self.aborted.append((request_id, reason))


def _engine(scheduler: RecordingScheduler) -> Engine:
    engine = Engine.__new__(Engine)  # no model: only events() is exercised
    engine.scheduler = scheduler  # type: ignore[assignment]
    engine._accepting = True
    return engine


async def _consume(engine: Engine, request: GenerationRequest, seen: list[EngineEvent]) -> None:
    async for event in engine.events(request):
        seen.append(event)


async def _cancel_after_turns(turns: int) -> tuple[bool, RecordingScheduler]:
    scheduler = RecordingScheduler()
    engine = _engine(scheduler)
    request = GenerationRequest("req", [1, 2, 3], 100, deadline=time.monotonic() + 60)
    seen: list[EngineEvent] = []
    consumer = asyncio.create_task(_consume(engine, request, seen))
    await scheduler.submitted.wait()
    for _ in range(3):
        await asyncio.sleep(0)  # the consumer is now parked on its queue
    scheduler.sink(TokensGenerated([7]))
    for _ in range(turns):
        await asyncio.sleep(0)
    consumer.cancel()
    try:
        async with asyncio.timeout(5):
            await consumer
    except asyncio.CancelledError:
        return True, scheduler
    except TimeoutError:
        return False, scheduler  # still iterating: the cancellation was lost
    return False, scheduler


@pytest.mark.parametrize("turns", range(8))
def test_a_cancellation_at_any_turn_ends_the_consumer_and_aborts(turns: int) -> None:
    cancelled, scheduler = asyncio.run(_cancel_after_turns(turns))
    assert cancelled, f"the cancellation {turns} loop turns after the event was swallowed"
    assert scheduler.aborted == [("req", FinishReason.ABORT)]
