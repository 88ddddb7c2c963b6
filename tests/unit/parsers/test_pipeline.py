"""OutputParser: reasoning first, then tool calls in what follows it."""

from __future__ import annotations

from vllm_mlx.parsers import (
    ContentDelta,
    ReasoningDelta,
    ToolCallArgumentsDelta,
    ToolCallStart,
    ToolSpec,
    make_output_parser,
)

from .fixtures import stream, summary

TOOLS = [ToolSpec("get_weather", {"type": "object", "properties": {"city": {"type": "string"}}})]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
DS_CALL = (
    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
    '{"city": "Paris"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>'
)


def test_without_parsers_text_passes_through_untouched() -> None:
    parser = make_output_parser(None, None, TOOLS, False)
    text = "  raw " + CALL + " <think>x</think>\n"
    assert parser.feed(text) == [ContentDelta(text)]
    assert parser.finish() == []
    assert parser.parse(text).content == text


def test_reasoning_only() -> None:
    parser = make_output_parser(None, "qwen3", TOOLS, False)
    parsed = parser.parse("<think>hmm " + CALL + "</think>" + CALL)
    assert parsed.reasoning == "hmm " + CALL
    assert parsed.content == CALL
    assert parsed.tool_calls == ()


def test_tool_calls_only_leave_think_tags_as_content() -> None:
    parsed = make_output_parser("hermes", None, TOOLS, False).parse("<think>a</think>" + CALL)
    assert parsed.content == "<think>a</think>"
    assert [c.name for c in parsed.tool_calls] == ["get_weather"]


def test_call_markup_inside_reasoning_stays_reasoning() -> None:
    parser = make_output_parser("deepseek", "deepseek_r1", TOOLS, True)
    text = "Maybe " + DS_CALL + " is right.\n</think>\n\nLet me call it." + DS_CALL
    assert summary(parser.parse(text)) == {
        "reasoning": "Maybe " + DS_CALL + " is right.",
        "content": "Let me call it.",
        "tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}],
    }


def test_events_come_reasoning_first_then_content_then_calls() -> None:
    parser = make_output_parser("qwen", "qwen3", TOOLS, True)
    text = "Plan: check the weather.\n</think>\n\nChecking.\n" + CALL
    events = stream(parser, [text[i : i + 5] for i in range(0, len(text), 5)])
    kinds = [type(e) for e in events]
    last_reasoning = max(i for i, k in enumerate(kinds) if k is ReasoningDelta)
    first_other = min(i for i, k in enumerate(kinds) if k is not ReasoningDelta)
    assert last_reasoning < first_other
    assert kinds[-2:] == [ToolCallStart, ToolCallArgumentsDelta]
    assert "".join(e.text for e in events if isinstance(e, ContentDelta)) == "Checking."


def test_parse_uses_a_fresh_pipeline_each_time() -> None:
    parser = make_output_parser("hermes", "qwen3", TOOLS, False)
    parser.feed("<think>half")
    first = parser.parse("<think>r</think>" + CALL)
    second = parser.parse("<think>r</think>" + CALL)
    assert summary(first) == summary(second)
    assert first.tool_calls[0].id != second.tool_calls[0].id
    assert [e.text for e in parser.feed(" done</think>ok") if isinstance(e, ReasoningDelta)]
