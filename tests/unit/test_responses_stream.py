"""Parser events -> Responses stream events and the response object (ResponseBuilder).

Tool calls and reasoning come from the real parser library on the recorded
Hermes/Qwen3-style reply; every event and every response is checked against the
OpenAI spec and the stream protocol.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from tests.support.replay import HERMES_CALL, THOUGHT
from tests.support.responses import check_stream, parse_sse, texts, validate_response
from vllm_mlx.api.errors import APIError
from vllm_mlx.api.responses.builder import ResponseBuilder, response_base
from vllm_mlx.api.responses.schema import CreateResponseRequest
from vllm_mlx.api.sse import named_event
from vllm_mlx.engine.types import Finished, FinishReason, SamplingParams, Usage
from vllm_mlx.parsers import ContentDelta, ParserEvent, ToolSpec, make_output_parser

SPECS = [ToolSpec("get_weather"), ToolSpec("get_time")]


def builder(namespaces: dict[str, tuple[str, str]] | None = None, **body: Any) -> ResponseBuilder:
    request = CreateResponseRequest.model_validate({"model": "m", "input": "hi", **body})
    base = response_base(request, "resp_1", SamplingParams(temperature=0.5, top_p=0.9))
    return ResponseBuilder(base, namespaces or {}, lambda text: len(text.split()), None)


def run(
    events: Iterable[ParserEvent], finished: Finished, make: Any = builder
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The checked stream (through SSE framing), and the non-streaming response."""
    events = list(events)
    streamed: ResponseBuilder = make()
    frames = [*streamed.start()]
    for event in events:
        frames.extend(streamed.feed(event))
    frames.extend(streamed.finish(finished))
    sse = b"".join(named_event(f["type"], f) for f in frames).decode()
    parsed = parse_sse(sse)
    final = check_stream(parsed)
    whole: ResponseBuilder = make()
    for event in events:
        whole.feed(event)
    whole.finish(finished)
    validate_response(whole.response)
    # Ids are fresh per builder; everything else must agree between the two modes.
    assert _without_ids(whole.response) == _without_ids(final)
    return parsed, final


def _without_ids(response: dict[str, Any]) -> list[dict[str, Any]]:
    return [{k: v for k, v in item.items() if k != "id"} for item in response["output"]]


def done(reason: FinishReason = FinishReason.STOP) -> Finished:
    return Finished(reason, Usage(10, 7, cached_tokens=4, cache_write_tokens=2))


def replayed(pieces: int = 7) -> list[ParserEvent]:
    """The recorded reply, fed in `pieces` chunks through hermes + qwen3 parsers."""
    text = json.loads(HERMES_CALL.read_text())["text"]
    parser = make_output_parser("hermes", "qwen3", SPECS, False)
    size = len(text) // pieces + 1
    out: list[ParserEvent] = []
    for start in range(0, len(text), size):
        out.extend(parser.feed(text[start : start + size]))
    out.extend(parser.finish())
    return out


def test_text_stream_event_sequence_and_usage() -> None:
    events, response = run([ContentDelta("Hello"), ContentDelta(" world")], done())
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert events[0]["response"]["status"] == "in_progress"
    assert events[0]["response"]["output"] == []
    assert response["status"] == "completed" and response["completed_at"] is not None
    message = response["output"][0]
    assert message["type"] == "message" and message["role"] == "assistant"
    assert message["content"][0]["text"] == "Hello world"
    assert response["usage"] == {
        "input_tokens": 10,
        "input_tokens_details": {"cached_tokens": 4, "cache_write_tokens": 2},
        "output_tokens": 7,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 17,
    }
    assert (response["temperature"], response["top_p"]) == (0.5, 0.9)


def test_length_is_incomplete_with_the_reason() -> None:
    events, response = run([ContentDelta("cut")], done(FinishReason.LENGTH))
    assert events[-1]["type"] == "response.incomplete"
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}
    assert response["output"][0]["status"] == "incomplete"


def test_empty_output_is_a_completed_response_without_items() -> None:
    events, response = run([], done())
    assert [e["type"] for e in events[2:]] == ["response.completed"]
    assert response["output"] == []


def test_reasoning_text_and_calls_from_the_recorded_reply() -> None:
    events, response = run(replayed(), done(FinishReason.TOOL_CALLS))
    kinds = [item["type"] for item in response["output"]]
    assert kinds == ["reasoning", "message", "function_call", "function_call"]
    reasoning = response["output"][0]
    assert reasoning["summary"] == [{"type": "summary_text", "text": THOUGHT}]
    assert texts(events, "response.reasoning_summary_text.delta") == THOUGHT
    summary_done = [e for e in events if e["type"] == "response.reasoning_summary_text.done"]
    assert summary_done[0]["text"] == THOUGHT
    calls = response["output"][2:]
    assert [c["name"] for c in calls] == ["get_weather", "get_time"]
    assert json.loads(calls[0]["arguments"]) == {"city": "Paris", "unit": "celsius"}
    assert all(c["call_id"].startswith("call_") and c["status"] == "completed" for c in calls)
    argument_events = [e for e in events if e["type"] == "response.function_call_arguments.done"]
    assert [e["arguments"] for e in argument_events] == [c["arguments"] for c in calls]
    assert texts(events, "response.function_call_arguments.delta") == "".join(
        c["arguments"] for c in calls
    )
    # The counter stands in for the tokenizer: the thought's words.
    assert response["usage"]["output_tokens_details"]["reasoning_tokens"] == min(
        len(THOUGHT.split()), 7
    )


def test_parallel_tool_calls_false_keeps_the_first_call() -> None:
    def first_only() -> ResponseBuilder:
        made = builder(parallel_tool_calls=False)
        return ResponseBuilder(made.response, {}, lambda text: 0, max_calls=1)

    _, response = run(replayed(), done(FinishReason.TOOL_CALLS), first_only)
    calls = [item for item in response["output"] if item["type"] == "function_call"]
    assert [c["name"] for c in calls] == ["get_weather"]
    assert response["parallel_tool_calls"] is False


def test_namespaced_call_comes_back_with_its_namespace() -> None:
    from vllm_mlx.parsers import ToolCallArgumentsDelta, ToolCallStart

    events = [ToolCallStart(0, "call_1", "tools.get_time"), ToolCallArgumentsDelta(0, "{}")]
    _, response = run(events, done(), lambda: builder({"tools.get_time": ("tools", "get_time")}))
    call = response["output"][0]
    assert (call["namespace"], call["name"], call["arguments"]) == ("tools", "get_time", "{}")


def test_failure_closes_the_open_item_and_reports_the_error() -> None:
    made = builder()
    frames = [*made.start(), *made.feed(ContentDelta("par")), *made.fail(APIError(504, "slow"))]
    response = check_stream(frames)
    assert frames[-1]["type"] == "response.failed"
    assert response["status"] == "failed"
    assert response["error"] == {"code": "server_error", "message": "slow"}
    assert response["output"][0]["status"] == "incomplete"


def test_request_fields_are_echoed() -> None:
    made = builder(
        instructions="Be brief.",
        metadata={"k": "v"},
        max_output_tokens=20,
        tools=[{"type": "function", "name": "f", "parameters": {"type": "object"}}],
        tool_choice="required",
        reasoning={"effort": "low", "summary": "auto"},
        store=False,
        user="u1",
        prompt_cache_key="key",
    )
    response = made.response
    validate_response(response)
    assert response["instructions"] == "Be brief." and response["metadata"] == {"k": "v"}
    assert response["tools"] == [
        {
            "type": "function",
            "name": "f",
            "description": None,
            "parameters": {"type": "object"},
            "strict": None,
        }
    ]
    assert response["tool_choice"] == "required" and response["store"] is False
    assert response["reasoning"] == {"effort": "low", "summary": "auto"}
    assert (response["user"], response["prompt_cache_key"]) == ("u1", "key")
