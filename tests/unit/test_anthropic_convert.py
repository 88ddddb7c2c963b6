"""Messages requests -> chat template input, and neutral errors -> Anthropic errors."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from tests.support.anthropic import validate
from vllm_mlx.api import error_shapes
from vllm_mlx.api.anthropic import convert
from vllm_mlx.api.anthropic.schema import CountTokensRequest, MessagesRequest
from vllm_mlx.api.errors import APIError, from_validation_error, to_api_error
from vllm_mlx.engine.types import FinishReason, raise_for_failure

WEATHER = {
    "name": "get_weather",
    "description": "Weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}
TIME = {"name": "get_time", "input_schema": {"type": "object"}}
ASK = {"role": "user", "content": "Weather in Paris?"}
CALL = {
    "role": "assistant",
    "content": [
        {"type": "text", "text": "Checking."},
        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
    ],
}


def tool_result(content: Any, tool_use_id: str = "toolu_1", **extra: Any) -> dict[str, Any]:
    block = {"type": "tool_result", "tool_use_id": tool_use_id, "content": content, **extra}
    return {"role": "user", "content": [block]}


def prompt(**fields: Any) -> convert.ChatPrompt:
    return convert.build_prompt(CountTokensRequest.model_validate({"model": "m", **fields}))


def rejected(**fields: Any) -> APIError:
    with pytest.raises(APIError) as caught:
        prompt(**fields)
    assert caught.value.status == 400
    return caught.value


def test_system_string_and_blocks_render_the_same() -> None:
    as_string = prompt(messages=[ASK], system="Be brief.\nBe kind.")
    blocks = [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}]
    as_blocks = prompt(messages=[ASK], system=blocks)
    assert as_string.messages == as_blocks.messages
    assert as_string.messages[0] == {"role": "system", "content": "Be brief.\nBe kind."}
    assert prompt(messages=[ASK]).messages == [{"role": "user", "content": "Weather in Paris?"}]


def test_tool_round_trip_becomes_tool_calls_and_a_tool_message() -> None:
    result = tool_result([{"type": "text", "text": "Sunny"}])
    result["content"].append({"type": "text", "text": "And tomorrow?"})
    chat = prompt(messages=[ASK, CALL, result], tools=[WEATHER])
    assert chat.messages[1] == {
        "role": "assistant",
        "content": "Checking.",
        "tool_calls": [
            {
                "id": "toolu_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
            }
        ],
    }
    assert chat.messages[2] == {
        "role": "tool",
        "tool_call_id": "toolu_1",
        "name": "get_weather",
        "content": "Sunny",
    }
    assert chat.messages[3] == {"role": "user", "content": "And tomorrow?"}
    assert chat.tools == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather in a city.",
                "parameters": WEATHER["input_schema"],
            },
        }
    ]
    assert [spec.name for spec in chat.tool_specs] == ["get_weather"]


def test_tool_result_error_is_marked() -> None:
    chat = prompt(messages=[ASK, CALL, tool_result("timeout", is_error=True)])
    assert chat.messages[2]["content"] == "Error: timeout"


def test_tool_result_must_answer_the_previous_assistant_turn() -> None:
    error = rejected(messages=[ASK, CALL, tool_result("x", "toolu_2")])
    assert "toolu_2" in error.message and "messages[2].content[0]" in error.message
    # An id from an earlier turn is not open any more.
    later = [ASK, CALL, tool_result("x"), {"role": "assistant", "content": "ok"}]
    assert "toolu_1" in rejected(messages=[*later, tool_result("y")]).message


def _executed(tool_use_id: str, text: str) -> dict[str, Any]:
    content = [{"type": "text", "text": text}]
    return {"type": "mcp_tool_result", "tool_use_id": tool_use_id, "content": content}


def _use(tool_use_id: str, **extra: Any) -> dict[str, Any]:
    block = {"type": "tool_use", "id": tool_use_id, "name": "demo__add", "input": {"a": 2}}
    return {**block, **extra}


def test_a_streamed_execute_reply_sent_back_renders_calls_results_and_text_in_order() -> None:
    # As `mcp_tools: execute` streams it: executed calls (marked `mcp`) each followed by
    # its result, then the text after it and a last call the client must answer.
    reply = {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Adding."},
            _use("toolu_a", mcp={"server": "demo"}),
            _executed("toolu_a", "5"),
            {"type": "text", "text": "Again."},
            {"type": "mcp_tool_use", "id": "toolu_b", "name": "demo__add", "server_name": "demo"},
            _executed("toolu_b", "7"),
            _use("toolu_c"),
        ],
    }
    chat = prompt(messages=[ASK, reply, tool_result("9", "toolu_c")])
    shape = [(m["role"], m.get("content"), [c["id"] for c in m.get("tool_calls", [])])
             for m in chat.messages]  # fmt: skip
    assert shape == [
        ("user", "Weather in Paris?", []),
        ("assistant", "Adding.", ["toolu_a"]),
        ("tool", "5", []),
        ("assistant", "Again.", ["toolu_b"]),
        ("tool", "7", []),
        ("assistant", "", ["toolu_c"]),
        ("tool", "9", []),
    ]
    # Every executed call answered: the model goes on from the last result.
    done = {"role": "assistant", "content": [_use("toolu_a"), _executed("toolu_a", "5")]}
    assert prompt(messages=[ASK, done]).messages[-1]["role"] == "tool"


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ([_executed("toolu_x", "5")], "toolu_x"),  # no call before it
        ([_use("toolu_a"), _executed("toolu_a", "5"), _executed("toolu_a", "6")], "toolu_a"),
    ],
)
def test_an_mcp_tool_result_must_follow_its_own_call(
    content: list[dict[str, Any]], needle: str
) -> None:
    error = rejected(messages=[ASK, {"role": "assistant", "content": content}])
    assert needle in error.message and "mcp_tool_result" in error.message
    # A server-run result never answers a call from the user's side.
    answered = [ASK, CALL, {"role": "user", "content": [_executed("toolu_1", "5")]}]
    assert "assistant messages" in rejected(messages=answered).message
    # A call already answered by its mcp_tool_result is not open for a tool_result.
    closed = {"role": "assistant", "content": [_use("toolu_a"), _executed("toolu_a", "5")]}
    assert "toolu_a" in rejected(messages=[ASK, closed, tool_result("5", "toolu_a")]).message


@pytest.mark.parametrize(
    "content",
    [
        [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "A"}}],
        [{"type": "text", "text": "hi"}, {"type": "image", "source": {"type": "url", "url": "u"}}],
    ],
)
def test_images_are_refused(content: list[dict[str, Any]]) -> None:
    error = rejected(messages=[{"role": "user", "content": content}])
    assert "model does not accept images" in error.message


def test_image_inside_a_tool_result_is_refused() -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "A"}}
    error = rejected(messages=[ASK, CALL, tool_result([image])])
    assert "does not accept images" in error.message


def test_blocks_in_the_wrong_role_are_refused() -> None:
    assert (
        "user messages"
        in rejected(messages=[ASK, {**tool_result("x"), "role": "assistant"}]).message
    )
    use = {"type": "tool_use", "id": "t", "name": "f", "input": {}}
    assert "assistant messages" in rejected(messages=[{"role": "user", "content": [use]}]).message


def test_tool_choice_none_offers_no_tools() -> None:
    chat = prompt(messages=[ASK], tools=[WEATHER], tool_choice={"type": "none"})
    assert chat.tools is None and chat.tool_specs == []


def test_tool_choice_any_adds_an_instruction() -> None:
    chat = prompt(messages=[ASK], system="Hi.", tools=[WEATHER, TIME], tool_choice={"type": "any"})
    assert chat.tools is not None and len(chat.tools) == 2
    assert chat.messages[0]["content"].startswith("Hi.\n\nYou must respond by calling one")


def test_tool_choice_tool_offers_only_that_tool() -> None:
    choice = {"type": "tool", "name": "get_time"}
    chat = prompt(messages=[ASK], tools=[WEATHER, TIME], tool_choice=choice)
    assert [t["function"]["name"] for t in chat.tools or []] == ["get_time"]
    assert "'get_time'" in chat.messages[0]["content"]


def test_tool_choice_errors() -> None:
    missing = {"type": "tool", "name": "nope"}
    assert (
        "not in 'tools'" in rejected(messages=[ASK], tools=[WEATHER], tool_choice=missing).message
    )
    assert "at least one tool" in rejected(messages=[ASK], tool_choice={"type": "any"}).message
    server_tool = {"type": "web_search_20250305", "name": "web_search"}
    assert "server tool" in rejected(messages=[ASK], tools=[server_tool]).message


def test_final_assistant_turn_is_a_prefill() -> None:
    chat = prompt(messages=[ASK, {"role": "assistant", "content": "It is"}])
    assert chat.continue_final and chat.messages[-1] == {"role": "assistant", "content": "It is"}
    empty = prompt(messages=[ASK, {"role": "assistant", "content": ""}])
    assert not empty.continue_final and empty.messages[-1]["role"] == "user"
    assert "tool_result" in rejected(messages=[ASK, CALL]).message


def test_thinking_switch_and_history() -> None:
    assert prompt(messages=[ASK]).template_kwargs == {}
    on = prompt(messages=[ASK], thinking={"type": "enabled", "budget_tokens": 2048})
    assert on.template_kwargs == {"enable_thinking": True}
    off = prompt(messages=[ASK], thinking={"type": "disabled"})
    assert off.template_kwargs == {"enable_thinking": False}
    history = {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "Hmm.", "signature": "sig"},
            {"type": "redacted_thinking", "data": "opaque"},
            {"type": "text", "text": "Done."},
        ],
    }
    chat = prompt(messages=[ASK, history, {"role": "user", "content": "Thanks"}])
    assert chat.messages[1] == {
        "role": "assistant",
        "content": "Done.",
        "reasoning_content": "Hmm.",
    }


class RecordingTokenizer:
    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def apply_chat_template(self, messages: Any, **kwargs: Any) -> list[int]:
        self.calls.append({"messages": messages, **kwargs})
        return list(range(len(messages) * 3))


def test_prompt_tokens_pass_tools_prefill_and_kwargs_to_the_template() -> None:
    tokenizer = RecordingTokenizer()
    chat = prompt(
        messages=[ASK, {"role": "assistant", "content": "It"}],
        tools=[WEATHER],
        thinking={"type": "enabled"},
    )
    assert convert.prompt_tokens(tokenizer, chat) == list(range(6))
    call = tokenizer.calls[0]
    assert call["continue_final_message"] is True and call["add_generation_prompt"] is False
    assert call["tools"] == chat.tools and call["enable_thinking"] is True


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"model": "m", "messages": [ASK]}, "'max_tokens' is a required property"),
        ({"model": "m", "messages": [], "max_tokens": 1}, "at least one message is required"),
        ({"model": "m", "messages": [ASK], "max_tokens": 0}, "max_tokens"),
        (
            {"model": "m", "messages": [ASK], "max_tokens": 1, "tool_choice": {"type": "tool"}},
            "needs the 'name'",
        ),
    ],
)
def test_request_validation_messages_say_which_field(body: dict[str, Any], needle: str) -> None:
    with pytest.raises(ValidationError) as caught:
        MessagesRequest.model_validate(body)
    assert needle in from_validation_error(caught.value).message


@pytest.mark.parametrize(
    ("error", "wire_type"),
    [
        (APIError(400, "x", "invalid_request"), "invalid_request_error"),
        (APIError(401, "x", "authentication"), "authentication_error"),
        (APIError(404, "x", "not_found"), "not_found_error"),
        (APIError(429, "x", "rate_limit"), "rate_limit_error"),
        (APIError(500, "x", "server_error"), "api_error"),
        (APIError(503, "x", "unavailable"), "overloaded_error"),
        (APIError(529, "x", "something_new"), "overloaded_error"),
        (APIError(403, "x", "something_new"), "permission_error"),
        (APIError(502, "x", "something_new"), "api_error"),
    ],
)
def test_error_bodies(error: APIError, wire_type: str) -> None:
    body = error_shapes.anthropic_error_body(error)
    assert body == {"type": "error", "error": {"type": wire_type, "message": "x"}}
    validate(body, "ErrorResponse")


def _failure(reason: FinishReason, message: str = "", refused: bool = False) -> APIError | None:
    try:
        raise_for_failure(reason, message, refused)
    except Exception as exc:
        return to_api_error(exc)
    return None


def test_unfinished_generations_are_errors() -> None:
    assert _failure(FinishReason.STOP) is None
    assert _failure(FinishReason.LENGTH) is None
    error = _failure(FinishReason.ERROR, "engine error: boom")
    assert error is not None and error.status == 500 and "boom" in error.message
    assert error_shapes.anthropic_error_type(error) == "api_error"
    refused = _failure(FinishReason.ERROR, "top_k must be at least 0", refused=True)
    assert refused is not None and refused.status == 400
    assert error_shapes.anthropic_error_type(refused) == "invalid_request_error"
    aborted = _failure(FinishReason.ABORT, "the engine stopped")
    assert aborted is not None and aborted.status == 503
    assert error_shapes.anthropic_error_type(aborted) == "overloaded_error"


@pytest.mark.parametrize(
    ("status", "wire_type"),
    [(404, "not_found_error"), (405, "invalid_request_error"), (413, "request_too_large")],
)
def test_http_errors_are_typed_by_status(status: int, wire_type: str) -> None:
    assert error_shapes.anthropic_error_type(APIError(status, "x", kind="http")) == wire_type


def test_system_role_messages_join_the_system_prompt() -> None:
    # Claude Code sends instructions as role "system" messages between turns.
    note = {"role": "system", "content": "Agents: claude, Explore."}
    chat = prompt(messages=[ASK, note], system="Be brief.")
    assert chat.messages == [
        {"role": "system", "content": "Be brief.\n\nAgents: claude, Explore."},
        {"role": "user", "content": "Weather in Paris?"},
    ]
    image = {"type": "image", "source": {"type": "url", "url": "u"}}
    error = rejected(messages=[ASK, {"role": "system", "content": [image]}])
    assert "only text blocks" in error.message
