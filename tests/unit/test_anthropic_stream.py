"""Parser events -> Anthropic stream events and the final message (MessageBuilder).

The tool-use and thinking paths are driven by the real parser library on recorded
Hermes / Qwen3-style model text, so the mapping is checked from real parser events;
every stream is checked against the hosted spec and the event protocol.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from typing import Any

from tests.support.anthropic import check_stream, parse_sse, validate
from vllm_mlx.api.anthropic.builder import MessageBuilder
from vllm_mlx.api.pipeline.driver import with_keepalive
from vllm_mlx.api.sse import named_event
from vllm_mlx.engine.types import Finished, FinishReason, Usage
from vllm_mlx.parsers import (
    ContentDelta,
    ParserEvent,
    ToolCallArgumentsDelta,
    ToolCallStart,
    ToolSpec,
    make_output_parser,
)

WEATHER = ToolSpec("get_weather", {"type": "object", "properties": {"city": {"type": "string"}}})


def run(
    events: Iterable[ParserEvent], finished: Finished
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The checked stream, and the non-streaming message for the same events."""
    events = list(events)
    streamed = MessageBuilder("msg_1", "m", 10)
    frames = [*streamed.start()]
    for event in events:
        frames.extend(streamed.feed(event))
    frames.extend(streamed.finish(finished))
    sse = b"".join(named_event(f["type"], f) for f in frames).decode()
    checked = check_stream(parse_sse(sse))
    whole = MessageBuilder("msg_1", "m", 10)
    for event in events:
        whole.feed(event)
    message = whole.message(finished)
    validate(message, "Message")
    return checked, message


def done(reason: FinishReason = FinishReason.STOP, stop: str | None = None) -> Finished:
    return Finished(reason, Usage(10, 7, cached_tokens=3, cache_write_tokens=5), stop)


def parsed(
    text_pieces: list[str], tools: bool = True, reasoning: bool = False
) -> list[ParserEvent]:
    parser = make_output_parser(
        "hermes" if tools else None, "qwen3" if reasoning else None, [WEATHER], False
    )
    out: list[ParserEvent] = []
    for piece in text_pieces:
        out.extend(parser.feed(piece))
    out.extend(parser.finish())
    return out


def test_text_only_stream_and_message() -> None:
    events, message = run([ContentDelta("Hello"), ContentDelta(" world")], done())
    types = [e["type"] for e in events]
    assert types == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert events[2]["content_block"] == {"type": "text", "text": ""}
    assert message["content"] == [{"type": "text", "text": "Hello world"}]
    assert message["stop_reason"] == "end_turn" and message["stop_sequence"] is None
    # As Anthropic counts: the three input counts add up to the 10-token prompt.
    usage = {
        "input_tokens": 2,
        "output_tokens": 7,
        "cache_read_input_tokens": 3,
        "cache_creation_input_tokens": 5,
    }
    assert message["usage"] == usage
    assert events[-2]["usage"] == usage


def test_stop_reasons() -> None:
    _, message = run([ContentDelta("x")], done(FinishReason.STOP, "END"))
    assert (message["stop_reason"], message["stop_sequence"]) == ("stop_sequence", "END")
    _, message = run([ContentDelta("x")], done(FinishReason.LENGTH))
    assert message["stop_reason"] == "max_tokens"


def test_empty_output_is_one_empty_text_block() -> None:
    events, message = run([], done())
    assert message["content"] == [{"type": "text", "text": ""}]
    assert [e["type"] for e in events[2:4]] == ["content_block_start", "content_block_stop"]


def test_tool_call_from_the_hermes_parser() -> None:
    text = [
        "Let me check.",
        "<tool_call>\n",
        '{"name": "get_weather", ',
        '"arguments": {"city": "Paris"}}\n',
        "</tool_call>",
    ]
    events, message = run(parsed(text), done())
    starts = [e for e in events if e["type"] == "content_block_start"]
    assert [s["content_block"]["type"] for s in starts] == ["text", "tool_use"]
    tool_block = starts[1]["content_block"]
    assert tool_block["name"] == "get_weather" and tool_block["input"] == {}
    partial = "".join(
        e["delta"]["partial_json"]
        for e in events
        if e["type"] == "content_block_delta" and e["delta"]["type"] == "input_json_delta"
    )
    assert partial and all(e["index"] == 1 for e in events if "partial_json" in e.get("delta", {}))
    assert message["stop_reason"] == "tool_use"
    assert message["content"][0] == {"type": "text", "text": "Let me check."}
    assert message["content"][1] == {
        "type": "tool_use",
        "id": tool_block["id"],
        "name": "get_weather",
        "input": {"city": "Paris"},
    }


def test_two_tool_calls_are_two_blocks() -> None:
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "%s"}}\n</tool_call>\n'
    _, message = run(parsed([call % "Paris", call % "Rome"]), done())
    blocks = [b for b in message["content"] if b["type"] == "tool_use"]
    assert [b["input"]["city"] for b in blocks] == ["Paris", "Rome"]
    assert blocks[0]["id"] != blocks[1]["id"]
    assert message["stop_reason"] == "tool_use"


def test_thinking_then_answer() -> None:
    text = ["<think>\nThe user", " wants a city.\n</think>\n\n", "Paris."]
    events, message = run(parsed(text, tools=False, reasoning=True), done())
    assert [b["type"] for b in message["content"]] == ["thinking", "text"]
    assert "wants a city" in message["content"][0]["thinking"]
    assert message["content"][0]["signature"] == ""
    assert message["content"][1]["text"].strip() == "Paris."
    deltas = {e["delta"]["type"] for e in events if e["type"] == "content_block_delta"}
    assert deltas == {"thinking_delta", "text_delta"}


def test_cut_short_tool_call_keeps_max_tokens() -> None:
    builder = MessageBuilder("msg_1", "m", 10)
    builder.feed(ToolCallStart(0, "call_1", "get_weather"))
    builder.feed(ToolCallArgumentsDelta(0, '{"city": "Pa'))
    message = builder.message(done(FinishReason.LENGTH))
    assert message["stop_reason"] == "max_tokens"
    assert message["content"] == [
        {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {}}
    ]


def test_keepalive_ticks_while_waiting_and_closing_closes_the_source() -> None:
    async def scenario() -> tuple[list[str | None], bool]:
        release = asyncio.Event()
        closed = asyncio.Event()

        async def source() -> AsyncIterator[str]:
            try:
                yield "first"
                await release.wait()  # a long prefill: nothing to send for a while
                yield "second"
                await asyncio.Event().wait()  # never: the client leaves first
            finally:
                closed.set()

        seen: list[str | None] = []
        stream = with_keepalive(source(), every=0.01)
        async for item in stream:
            seen.append(item)
            if item is None and "second" not in seen:
                release.set()
            if item == "second":
                break
        await stream.aclose()  # what a disconnect does to the response's iterator
        return seen, closed.is_set()

    seen, closed = asyncio.run(scenario())
    assert seen[0] == "first" and seen[-1] == "second"
    assert None in seen[1:-1]  # at least one tick while the source was silent
    assert closed
