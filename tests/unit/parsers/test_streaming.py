"""Streaming behaviour every format shares: hold-back, event shape, robustness."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_mlx.parsers import (
    ContentDelta,
    ToolCallArgumentsDelta,
    ToolCallStart,
    ToolSpec,
    collect_events,
    get_tool_call_parser,
    make_output_parser,
    tool_call_parser_names,
)
from vllm_mlx.parsers.tool_calls.base import ToolCallParser

from .fixtures import CASES, split, stream, stream_summary, summary

TOOLS = [ToolSpec("get_weather", {"type": "object"}), ToolSpec("get_time", None)]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def hermes() -> ToolCallParser:
    return get_tool_call_parser("hermes")(TOOLS)


def test_text_that_may_start_a_marker_is_held_back() -> None:
    parser = hermes()
    assert parser.feed("It is sunny <tool_") == [ContentDelta("It is sunny")]
    assert parser.feed("ca") == []
    assert parser.feed("ke> recipe") == [ContentDelta(" <tool_cake> recipe")]


def test_content_streams_before_a_call_and_the_call_arrives_whole() -> None:
    parser = hermes()
    events = parser.feed("Let me check.\n<tool_call>\n")
    assert events == [ContentDelta("Let me check.")]
    assert parser.feed('{"name": "get_weather", "arguments": {"city": "Par') == []
    events = parser.feed('is"}}\n</tool_call>')
    assert len(events) == 2
    start, arguments = events
    assert isinstance(start, ToolCallStart) and start.index == 0 and start.name == "get_weather"
    assert arguments == ToolCallArgumentsDelta(index=0, fragment='{"city":"Paris"}')
    assert parser.finish() == []


def test_call_indexes_count_across_regions() -> None:
    events = stream(make_output_parser("hermes", None, TOOLS, False), [CALL, "\n", CALL])
    starts = [e for e in events if isinstance(e, ToolCallStart)]
    assert [s.index for s in starts] == [0, 1]
    assert len({s.id for s in starts}) == 2


def test_finish_flushes_an_unterminated_call_as_content() -> None:
    parser = hermes()
    assert parser.feed(CALL[:30]) == []
    assert parser.finish() == [ContentDelta(CALL[:30].rstrip())]


def test_empty_tool_list_accepts_no_call() -> None:
    parsed = get_tool_call_parser("hermes")([]).parse(CALL)
    assert parsed.tool_calls == ()
    assert parsed.content == CALL


def test_parse_does_not_disturb_a_stream_in_progress() -> None:
    parser = hermes()
    parser.feed("Hello <tool")
    assert parser.parse(CALL).tool_calls[0].name == "get_weather"
    assert collect_events(parser.feed("bar>") + parser.finish()).content == " <toolbar>"


# Fragments of every format's markup, to build adversarial outputs from.
PIECES = [
    "<tool_call>",
    "</tool_call>",
    "<function=",
    "</function>",
    "<parameter=city>",
    "</parameter>",
    "[TOOL_CALLS]",
    "[ARGS]",
    "[CALL_ID]",
    "<|tool_call|>",
    "<TOOLCALL>",
    "</TOOLCALL>",
    "<|python_tag|>",
    "<|python_start|>",
    "<|python_end|>",
    ">>>",
    "all\n",
    "get_weather\n",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁sep｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁calls▁end｜>",
    "<|tool_calls_section_begin|>",
    "<|tool_call_begin|>",
    "functions.get_weather:0",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
    "<|tool_calls_section_end|>",
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
    "```json\n",
    "```",
    "<think>",
    "</think>",
    '{"name": "get_weather", "arguments": {"city": "Paris"}}',
    '{"name": "get_time", "parameters": {}}',
    'get_weather(city="Paris")',
    "get_weather",
    '{"city": "Par',
    "{",
    "}",
    "[",
    "]",
    "(",
    ")",
    '"',
    "'",
    "\\",
    ";",
    ",",
    "\n",
    " ",
    "é",
    "🚀",
]
# Whole recorded outputs too, so that real calls meet junk around them.
RECORDED = sorted({case.text for case in CASES})
outputs = st.lists(
    st.one_of(st.sampled_from(PIECES), st.sampled_from(RECORDED), st.text(max_size=4)),
    max_size=14,
).map("".join)


@pytest.mark.parametrize("name", tool_call_parser_names())
@pytest.mark.parametrize("tools", [TOOLS, None], ids=["tools", "no_tools"])
@settings(max_examples=40, deadline=None)
@given(text=outputs, data=st.data())
def test_any_output_parses_without_error_and_independently_of_chunking(
    name: str, tools: list[ToolSpec] | None, text: str, data: st.DataObject
) -> None:
    parser = make_output_parser(name, None, tools, False)
    whole = summary(parser.parse(text))
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=8), label="cuts")
    assert stream_summary(parser.spawn(), split(text, cuts)) == whole
    # Nothing is lost: whatever is not a call comes back as content (Functionary's
    # "all" recipient line is markup, not content).
    drops_markup = name in {"auto", "functionary"} and "all\n" in text
    if not whole["tool_calls"] and not drops_markup:
        assert whole["content"] == text.strip()


@pytest.mark.parametrize("name", tool_call_parser_names())
def test_plain_prose_streams_through_every_parser(name: str) -> None:
    text = "Sure! Here are 3 tips:\n1. Drink water [a lot].\n2. Sleep (8h).\n>>> print('hi')"
    parser = get_tool_call_parser(name)(TOOLS)
    chunks = [text[i : i + 3] for i in range(0, len(text), 3)]
    events = stream(make_output_parser(name, None, TOOLS, False), chunks)
    assert all(isinstance(e, ContentDelta) for e in events)
    assert collect_events(events).content == text
    assert parser.parse(text).content == text


def test_model_ids_are_kept_where_the_template_expects_them_back() -> None:
    kimi = get_tool_call_parser("kimi")(None).parse(
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_time:0"
        '<|tool_call_argument_begin|>{"timezone": "UTC"}<|tool_call_end|>'
        "<|tool_calls_section_end|>"
    )
    assert [c.id for c in kimi.tool_calls] == ["functions.get_time:0"]
    mistral = get_tool_call_parser("mistral")(None)
    with_id = mistral.parse('[TOOL_CALLS][{"name": "f", "arguments": {}, "id": "a1B2c3D4e"}]')
    assert [c.id for c in with_id.tool_calls] == ["a1B2c3D4e"]
    fresh = mistral.parse("[TOOL_CALLS]f[ARGS]{}").tool_calls[0].id
    assert len(fresh) == 9 and fresh.isalnum()
