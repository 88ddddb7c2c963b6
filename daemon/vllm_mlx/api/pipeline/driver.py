"""The one driver: runs a turn's generations to a whole response or to a stream.

Each protocol implements a small WireBuilder (start / feed / finish / end / fail) that
turns neutral events into its wire shape; this module owns everything around it, once
for every protocol: the per-request log line and metrics, the split of text into
reasoning, content and tool calls, coalescing by `engine.stream_interval`, keep-alive
pings, several choices at once, server-side tool rounds, client disconnects (closing a
stream aborts its generations) and the error that travels as an event once the
response headers are sent.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from contextlib import aclosing
from dataclasses import replace
from typing import Any, Protocol, TypeVar, cast

from vllm_mlx.api.errors import APIError, to_api_error
from vllm_mlx.api.pipeline.observe import run
from vllm_mlx.api.pipeline.turn import Turn
from vllm_mlx.engine.output import OutputEvent
from vllm_mlx.engine.types import Finished, FinishReason, GenerationRequest, TextDelta
from vllm_mlx.parsers.pipeline import OutputParser
from vllm_mlx.parsers.types import (
    ContentDelta,
    ParserEvent,
    ReasoningDelta,
    ToolCallArgumentsDelta,
    ToolCallStart,
)

T = TypeVar("T")
Event = dict[str, Any]
ParsedEvent = ParserEvent | Finished
Run = AsyncIterator[ParsedEvent]


class WireBuilder:
    """One response in a protocol's wire shape, fed the neutral events of its runs.

    `index` is the run's place among the request's choices (0 when there is one).
    The non-streamed body is the same events folded together (`result`), so both modes
    always agree on what the model said.
    """

    keepalive_s: float | None = None  # a ping() after this many silent seconds
    trailer = b""  # sent after the last event of a stream (OpenAI's [DONE])

    def start(self) -> list[Event]:
        return []

    def feed(self, event: ParserEvent, index: int = 0) -> list[Event]:
        raise NotImplementedError

    def finish(self, finished: Finished, index: int = 0) -> list[Event]:
        raise NotImplementedError

    def end(self) -> list[Event]:
        """After every run finished."""
        return []

    def fail(self, error: APIError) -> list[Event]:
        raise NotImplementedError

    def ping(self) -> Event:
        raise NotImplementedError

    def frame(self, event: Event) -> bytes:
        raise NotImplementedError

    def result(self) -> dict[str, Any]:
        raise NotImplementedError

    def closed(self) -> None:
        """The response is over (whole, or streamed to its end)."""


class Rounds(Protocol):
    """Generations after the first of one response (server-side tool calls)."""

    async def next(self, finished: Finished) -> tuple[list[Event], list[Run] | Finished]:
        """After a round ended in `finished`: the events to send, then the next round's
        runs or the Finished that ends the response."""
        ...


def parsed(
    turn: Turn,
    request: GenerationRequest,
    parser: OutputParser | None,
    source: AsyncIterator[OutputEvent] | None = None,
) -> AsyncGenerator[ParsedEvent, None]:
    """The request's run (or `source`, a wrapper of it) with its text split into
    reasoning, content and tool calls; the final Finished says TOOL_CALLS when the
    model stopped after calling tools."""
    return _parsed(source or run(turn, request), parser)


async def _parsed(
    source: AsyncIterator[OutputEvent], parser: OutputParser | None
) -> AsyncGenerator[ParsedEvent, None]:
    called = False
    async with aclosing(cast(AsyncGenerator[OutputEvent, None], source)) as events:
        async for event in events:
            if isinstance(event, TextDelta):
                items = parser.feed(event.text) if parser else [ContentDelta(event.text)]
            else:
                items = parser.finish() if parser else []
            for item in items:
                if isinstance(item, ContentDelta | ReasoningDelta) and not item.text:
                    continue
                called = called or isinstance(item, ToolCallStart)
                yield item
            if isinstance(event, Finished):
                if called and event.reason is FinishReason.STOP:
                    event = replace(event, reason=FinishReason.TOOL_CALLS)
                yield event


async def limit_calls(events: Run, max_calls: int | None) -> AsyncGenerator[ParsedEvent, None]:
    """Drop tool calls past the first ``max_calls`` (parallel tool calls turned off)."""
    async with aclosing(cast(AsyncGenerator[ParsedEvent, None], events)) as source:
        async for event in source:
            if (
                max_calls is not None
                and isinstance(event, ToolCallStart | ToolCallArgumentsDelta)
                and event.index >= max_calls
            ):
                continue
            yield event


async def stream(
    runs: Sequence[Run], builder: WireBuilder, interval: int, rounds: Rounds | None = None
) -> AsyncIterator[bytes]:
    """The response as stream frames; an error after the start is sent as an event."""
    for event in builder.start():
        yield builder.frame(event)
    try:
        events = _events(runs, builder, interval, builder.keepalive_s, rounds)
        async with aclosing(events):
            async for event in events:
                yield builder.frame(event)
    except Exception as exc:  # headers are sent: the error travels as an event
        for event in builder.fail(to_api_error(exc)):
            yield builder.frame(event)
    if builder.trailer:
        yield builder.trailer
    builder.closed()


async def complete(
    runs: Sequence[Run], builder: WireBuilder, rounds: Rounds | None = None
) -> dict[str, Any]:
    """The whole response body; errors propagate (the router shapes them)."""
    events = _events(runs, builder, 1, None, rounds)
    async with aclosing(events):
        async for _ in events:
            pass
    builder.closed()
    return builder.result()


async def _events(
    runs: Sequence[Run],
    builder: WireBuilder,
    interval: int,
    keepalive_s: float | None,
    rounds: Rounds | None,
) -> AsyncGenerator[Event, None]:
    while True:
        ended: dict[int, Finished] = {}
        merged = merge([coalesced(r, interval) for r in runs])
        async with aclosing(with_keepalive(merged, keepalive_s)) as items:
            async for item in items:
                if item is None:
                    yield builder.ping()
                    continue
                index, event = item
                if not isinstance(event, Finished):
                    for out in builder.feed(event, index):
                        yield out
                    continue
                ended[index] = event
                if rounds is None:
                    for out in builder.finish(event, index):
                        yield out
        if len(ended) < len(runs):  # (a failed generation raised already, in run())
            raise APIError(500, "generation ended without a result", "server_error")
        if rounds is None:
            break
        sent, step = await rounds.next(ended[0])
        for out in sent:
            yield out
        if isinstance(step, Finished):
            for out in builder.finish(step):
                yield out
            break
        runs = step
    for out in builder.end():
        yield out


async def coalesced(events: Run, interval: int) -> AsyncGenerator[ParsedEvent, None]:
    """Join runs of text (or reasoning) deltas into one per `interval` tokens
    (engine.stream_interval); every other event passes at once."""
    pending: list[str] = []
    kind: type[ContentDelta] | type[ReasoningDelta] = ContentDelta
    async with aclosing(cast(AsyncGenerator[ParsedEvent, None], events)) as source:
        async for event in source:
            if interval <= 1:
                yield event
                continue
            if isinstance(event, ContentDelta | ReasoningDelta):
                if pending and not isinstance(event, kind):
                    yield kind("".join(pending))
                    pending = []
                kind = type(event)
                pending.append(event.text)
                if len(pending) >= interval:
                    yield kind("".join(pending))
                    pending = []
                continue
            if pending:
                yield kind("".join(pending))
                pending = []
            yield event


async def merge(streams: Sequence[AsyncIterator[T]]) -> AsyncGenerator[tuple[int, T], None]:
    """Items of every stream as they come, tagged with the stream's index.

    The first failure is raised here and the other streams are closed (which aborts
    their sequences); leaving early closes them all.
    """
    if len(streams) == 1:
        async with aclosing(cast(AsyncGenerator[T, None], streams[0])) as only:
            async for single in only:
                yield 0, single
        return
    queue: asyncio.Queue[tuple[int, T | None, BaseException | None, bool]] = asyncio.Queue()

    async def pump(index: int, stream: AsyncIterator[T]) -> None:
        try:
            async for item in stream:
                queue.put_nowait((index, item, None, False))
            queue.put_nowait((index, None, None, True))
        except Exception as exc:
            queue.put_nowait((index, None, exc, True))
        finally:
            close = getattr(stream, "aclose", None)
            if close is not None:
                with contextlib.suppress(Exception):
                    await close()

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        running = len(tasks)
        while running:
            index, item, error, done = await queue.get()
            if error is not None:
                raise error
            if done:
                running -= 1
                continue
            yield index, cast(T, item)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def with_keepalive(
    events: AsyncGenerator[T, None], every: float | None
) -> AsyncGenerator[T | None, None]:
    """`events`, plus None each time `every` seconds pass without one (never, for None).

    The pending item is awaited in its own task so a tick never cancels it; closing
    this iterator (client gone) cancels that task, which closes `events` and so
    aborts the generation behind it.
    """
    if every is None:
        async with aclosing(events):
            async for item in events:
                yield item
        return
    end = object()
    pending: asyncio.Future[Any] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(events, end))
            done, _ = await asyncio.wait({pending}, timeout=every)
            if not done:
                yield None
                continue
            item, pending = pending.result(), None
            if item is end:
                return
            yield item
    finally:
        if pending is not None and not pending.done():
            pending.cancel()
            await asyncio.wait({pending})
        await events.aclose()  # also when the client left while an item was being sent
