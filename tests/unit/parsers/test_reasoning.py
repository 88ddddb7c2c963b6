"""Reasoning parsers: where the reasoning starts and ends, whole and streamed."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_mlx.parsers import ContentDelta, ReasoningDelta, get_reasoning_parser
from vllm_mlx.parsers.reasoning import ReasoningParser
from vllm_mlx.parsers.reasoning.deepseek_r1 import DeepSeekR1ReasoningParser
from vllm_mlx.parsers.reasoning.qwen3 import Qwen3ReasoningParser

from .fixtures import split

QWEN3_THINKING_PROMPT = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
QWEN3_2507_PROMPT = QWEN3_THINKING_PROMPT + "<think>\n"
QWEN3_NO_THINKING_PROMPT = QWEN3_THINKING_PROMPT + "<think>\n\n</think>\n\n"
R1_PROMPT = "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜><think>\n"
R1_OLD_PROMPT = "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜>"
V31_NO_THINKING_PROMPT = "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜></think>"


def parts(parser: ReasoningParser, text: str) -> tuple[str, str]:
    parsed = parser.parse(text)
    assert parsed.tool_calls == ()
    return parsed.reasoning, parsed.content


@pytest.mark.parametrize(
    ("prompt", "opens"),
    [(QWEN3_THINKING_PROMPT, False), (QWEN3_2507_PROMPT, True), (QWEN3_NO_THINKING_PROMPT, False)],
)
def test_qwen3_reads_the_prompt_for_an_open_think_block(prompt: str, opens: bool) -> None:
    assert Qwen3ReasoningParser.prompt_opens_reasoning(prompt) is opens


@pytest.mark.parametrize(
    ("prompt", "opens"),
    [(R1_PROMPT, True), (R1_OLD_PROMPT, True), (V31_NO_THINKING_PROMPT, False)],
)
def test_deepseek_r1_assumes_reasoning_unless_the_prompt_closed_it(
    prompt: str, opens: bool
) -> None:
    assert DeepSeekR1ReasoningParser.prompt_opens_reasoning(prompt) is opens


def test_qwen3_splits_reasoning_from_the_answer() -> None:
    parser = Qwen3ReasoningParser()
    text = "<think>\nThe user greets me.\n</think>\n\nHello! How can I help?"
    assert parts(parser, text) == ("The user greets me.", "Hello! How can I help?")


def test_qwen3_without_tags_is_all_content() -> None:
    # enable_thinking: false puts an empty, closed block in the prompt: no tags here.
    text = "Hello! How can I help?"
    assert parts(Qwen3ReasoningParser(starts_in_reasoning=False), text) == ("", text)


def test_qwen3_with_the_block_opened_in_the_prompt() -> None:
    parser = Qwen3ReasoningParser(starts_in_reasoning=True)
    assert parts(parser, "Greeting.\n</think>\n\nHello!") == ("Greeting.", "Hello!")


def test_a_repeated_open_tag_after_the_prompt_opened_one_is_dropped() -> None:
    parser = Qwen3ReasoningParser(starts_in_reasoning=True)
    assert parts(parser, "<think>\nGreeting.\n</think>Hello!") == ("Greeting.", "Hello!")


def test_output_cut_off_while_reasoning_is_all_reasoning() -> None:
    parser = Qwen3ReasoningParser()
    assert parts(parser, "<think>\nFirst, consider the") == ("First, consider the", "")


def test_think_tag_later_in_the_answer_is_content() -> None:
    text = "Use the <think> tag like this: <think>...</think>."
    assert parts(Qwen3ReasoningParser(), text) == ("", text)


def test_deepseek_r1_reasoning_without_an_open_tag() -> None:
    parser = get_reasoning_parser("deepseek_r1")()
    assert parser.starts_in_reasoning
    text = "Okay, 2 + 2 is 4.\n</think>\n\nThe answer is **4**."
    assert parts(parser, text) == ("Okay, 2 + 2 is 4.", "The answer is **4**.")


def test_deepseek_r1_with_thinking_switched_off() -> None:
    parser = get_reasoning_parser("deepseek_r1")(starts_in_reasoning=False)
    assert parts(parser, "The answer is 4.") == ("", "The answer is 4.")


def test_reasoning_streams_as_it_arrives_and_holds_back_a_partial_close_tag() -> None:
    parser = Qwen3ReasoningParser()
    assert parser.feed("<thi") == []
    assert parser.feed("nk>\nLet me") == [ReasoningDelta("Let me")]
    assert parser.feed(" think</thi") == [ReasoningDelta(" think")]
    assert parser.feed("nk>\n\nHi") == [ContentDelta("Hi")]
    assert parser.feed(" there") == [ContentDelta(" there")]
    assert parser.finish() == []


TEXTS = [
    "<think>\nA < B but </thin is not a tag.\n</think>\n\nSo A is smaller.",
    "  <think>x</think>y",
    "no reasoning here </think> at all",
    "<think>unfinished",
    "<thinking>is not the tag</thinking>",
    "",
]


@pytest.mark.parametrize("name", ["qwen3", "deepseek_r1"])
@pytest.mark.parametrize("starts", [False, True])
@pytest.mark.parametrize("text", TEXTS)
@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_streaming_split_anywhere_matches_parse(
    name: str, starts: bool, text: str, data: st.DataObject
) -> None:
    cls = get_reasoning_parser(name)
    whole = cls(starts_in_reasoning=starts).parse(text)
    parser = cls(starts_in_reasoning=starts)
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=6), label="cuts")
    events = [e for chunk in split(text, cuts) for e in parser.feed(chunk)] + parser.finish()
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    content = "".join(e.text for e in events if isinstance(e, ContentDelta))
    assert (reasoning, content) == (whole.reasoning, whole.content)
