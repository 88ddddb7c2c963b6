"""Reading forced tool calls back from constrained output, streamed in any pieces."""

from __future__ import annotations

import json

import jsonschema
import pytest
from hypothesis import given
from hypothesis import strategies as st

from vllm_mlx.parsers.forced import CallListParser, NamedCallParser, call_list_schema
from vllm_mlx.parsers.types import ParserEvent, ToolSpec, collect_events

WEATHER = ToolSpec("get_weather", {"type": "object", "properties": {"city": {"type": "string"}}})
TIME = ToolSpec("get_time", None)
OUTPUT = (
    '[{"name": "get_weather", "arguments": {"city": "P}a\\"ri[s", "n": [1, {"a": {}}]}}, '
    '{"name": "get_time", "arguments": {}}]'
)


def _feed(
    parser: CallListParser | NamedCallParser, text: str, cuts: list[int]
) -> list[ParserEvent]:
    events: list[ParserEvent] = []
    start = 0
    for cut in [*sorted(set(cuts)), len(text)]:
        events += parser.feed(text[start:cut])
        start = max(start, cut)
    return events + parser.finish()


@given(st.lists(st.integers(0, len(OUTPUT)), max_size=40))
def test_call_list_is_the_same_however_it_is_cut(cuts: list[int]) -> None:
    parsed = collect_events(_feed(CallListParser(None), OUTPUT, cuts))
    expected = json.loads(OUTPUT)
    assert parsed.content == ""
    assert [c.name for c in parsed.tool_calls] == ["get_weather", "get_time"]
    assert [json.loads(c.arguments) for c in parsed.tool_calls] == [
        item["arguments"] for item in expected
    ]
    assert all(c.id.startswith("call_") for c in parsed.tool_calls)


def test_call_starts_before_its_arguments_end() -> None:
    parser = CallListParser(None)
    events = parser.feed('[{"name": "get_weather", "arguments": {"ci')
    assert [type(e).__name__ for e in events] == ["ToolCallStart", "ToolCallArgumentsDelta"]


def test_a_cut_before_any_call_is_content() -> None:
    parsed = collect_events(_feed(CallListParser(None), '[{"name": "get_w', []))
    assert parsed.tool_calls == () and parsed.content == '{"name": "get_w'


def test_named_call_is_the_whole_output() -> None:
    parsed = collect_events(_feed(NamedCallParser([TIME]), '{"tz": "UTC"}', [3, 5]))
    (call,) = parsed.tool_calls
    assert call.name == "get_time" and json.loads(call.arguments) == {"tz": "UTC"}


@pytest.mark.parametrize("single", [False, True])
def test_call_list_schema_accepts_only_offered_calls(single: bool) -> None:
    schema = call_list_schema([WEATHER, TIME], single)
    jsonschema.validate(json.loads(OUTPUT)[:1], schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([{"name": "other", "arguments": {}}], schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([], schema)
    if single:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(json.loads(OUTPUT), schema)


def test_named_call_cut_before_any_argument_is_no_call() -> None:
    parser = NamedCallParser([TIME])
    assert parser.feed("") == [] and parser.finish() == []
