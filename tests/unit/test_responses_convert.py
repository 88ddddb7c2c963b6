"""Responses input -> chat messages and tools; bad input names its field; the store."""

from __future__ import annotations

from typing import Any

import pytest

from vllm_mlx.api.errors import APIError
from vllm_mlx.api.responses import convert, tools
from vllm_mlx.api.responses.schema import CreateResponseRequest
from vllm_mlx.api.responses.store import ResponseStore

WEATHER = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}


def body(**fields: Any) -> CreateResponseRequest:
    return CreateResponseRequest.model_validate({"model": "m", **fields})


def messages(items: list[dict[str, Any]], **fields: Any) -> list[dict[str, Any]]:
    request = body(input=items, **fields)
    return convert.chat_messages(convert.input_items(request), request.instructions, 0)


def error(items: Any, **fields: Any) -> APIError:
    with pytest.raises(APIError) as caught:
        request = body(input=items, **fields)
        convert.check_unsupported(request)
        convert.chat_messages(convert.input_items(request), None, 0)
        tools.offered(tools.tool_set(request), request.tool_choice)
    assert caught.value.status == 400
    return caught.value


def test_string_input_is_one_user_message_after_the_instructions() -> None:
    request = body(input="Hi", instructions="Be brief.")
    items = convert.input_items(request)
    assert items[0]["content"] == [{"type": "input_text", "text": "Hi"}]
    assert items[0]["id"].startswith("msg_") and items[0]["status"] == "completed"
    assert convert.chat_messages(items, request.instructions, 0) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
    ]


def test_roles_parts_calls_outputs_and_reasoning() -> None:
    result = messages(
        [
            {"role": "developer", "content": "Use tools."},
            {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Call it."}]},
            {"role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
            {
                "type": "function_call",
                "call_id": "c1",
                "name": "get_weather",
                "arguments": '{"a":1}',
            },
            {"type": "function_call", "call_id": "c2", "name": "t", "namespace": "ns"},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            {
                "type": "function_call_output",
                "call_id": "c2",
                "output": [{"type": "input_text", "text": "noon"}],
            },
            {"role": "system", "content": "Answer in French."},
        ],
        instructions="Be brief.",
    )
    assert result[0] == {
        "role": "system",
        "content": "Be brief.\n\nUse tools.\n\nAnswer in French.",
    }
    assert result[1] == {"role": "user", "content": "Weather?"}
    assistant = result[2]
    assert assistant["content"] == "Checking." and assistant["reasoning_content"] == "Call it."
    calls = assistant["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["get_weather", "ns.t"]
    assert calls[0]["function"]["arguments"] == {"a": 1}
    assert result[3] == {
        "role": "tool",
        "tool_call_id": "c1",
        "name": "get_weather",
        "content": "sunny",
    }
    assert result[4]["content"] == "noon" and result[4]["name"] == "ns.t"
    assert len(result) == 5


def test_calls_from_the_stored_history_match_new_outputs() -> None:
    history = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Q"}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
    ]
    new = convert.input_items(
        body(input=[{"type": "function_call_output", "call_id": "c1", "output": "1"}])
    )
    result = convert.chat_messages([*history, *new], None, len(history))
    assert result[-1]["role"] == "tool" and result[-1]["tool_call_id"] == "c1"


@pytest.mark.parametrize(
    ("items", "param", "words"),
    [
        ([{"type": "computer_call"}], "input[0].type", "unknown input item type"),
        ([{"foo": 1}], "input[0].type", "unknown input item type"),
        ([{"type": "item_reference", "id": "x"}], "input[0].type", "previous_response_id"),
        (
            [{"type": "function_call_output", "call_id": "nope", "output": "x"}],
            "input[0].call_id",
            "no function_call with call_id 'nope'",
        ),
        (
            [
                {"role": "user", "content": "a"},
                {"role": "user", "content": [{"type": "text", "text": "b"}]},
            ],
            "input[1].content[0].type",
            "'text' is not valid",
        ),
        (
            [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}],
            "input[0].content[0].type",
            "does not accept images",
        ),
        (
            [{"role": "user", "content": [{"type": "refusal", "refusal": "no"}]}],
            "input[0].content[0].type",
            "not valid here",
        ),
        ([{"role": "tool", "content": "x"}], "input[0].role", "Invalid value"),
        (
            [{"role": "user", "content": [{"type": "input_text"}]}],
            "input[0].content[0].text",
            "required",
        ),
        (
            [{"type": "function_call", "call_id": "c", "arguments": "{}"}],
            "input[0].name",
            "required",
        ),
    ],
)
def test_bad_items_name_the_field(items: list[Any], param: str, words: str) -> None:
    problem = error(items)
    assert problem.param == param
    assert words in problem.message


def test_empty_input_needs_a_previous_response() -> None:
    assert error("").param == "input"
    assert error([]).param == "input"
    assert convert.input_items(body(input=None, previous_response_id="resp_1")) == []


def test_tools_namespaces_and_hosted_types() -> None:
    request = body(
        input="x",
        tools=[
            WEATHER,
            {"type": "web_search"},
            {
                "type": "namespace",
                "name": "mcp",
                "description": "d",
                "tools": [
                    {"type": "function", "name": "read", "description": "Read a file"},
                    {"type": "custom", "name": "patch"},
                ],
            },
            {"type": "image_generation"},
        ],
    )
    toolset = tools.tool_set(request)
    assert [spec.name for spec in toolset.specs] == ["get_weather", "mcp.read"]
    assert toolset.template[1]["function"] == {
        "name": "mcp.read",
        "parameters": {},
        "description": "Read a file",
    }
    assert toolset.namespaces == {"mcp.read": ("mcp", "read")}
    assert toolset.left_out == ["web_search", "mcp.custom", "image_generation"]


@pytest.mark.parametrize(
    ("choice", "names"),
    [
        (None, ["get_weather", "f2"]),
        ("auto", ["get_weather", "f2"]),
        ("required", ["get_weather", "f2"]),
        ("none", []),
        ({"type": "function", "name": "f2"}, ["f2"]),
        (
            {
                "type": "allowed_tools",
                "mode": "auto",
                "tools": [{"type": "function", "name": "f2"}],
            },
            ["f2"],
        ),
    ],
)
def test_tool_choice_narrows_the_offer(choice: Any, names: list[str]) -> None:
    request = body(input="x", tools=[WEATHER, {**WEATHER, "name": "f2"}], tool_choice=choice)
    offered = tools.offered(tools.tool_set(request), request.tool_choice)
    assert [spec.name for spec in offered.specs] == names


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tool_choice": {"type": "function", "name": "missing"}}, "tool_choice.name"),
        ({"tool_choice": "always"}, "tool_choice"),
        ({"tool_choice": {"type": "web_search_preview"}}, "tool_choice.type"),
        ({"tools": [{"type": "function"}]}, "tools[0].name"),
        (
            {"tools": [{"type": "namespace", "name": "n", "tools": [{"type": "function"}]}]},
            "tools[0].tools[0].name",
        ),
        ({"background": True}, "background"),
        ({"conversation": "conv_1"}, "conversation"),
    ],
)
def test_bad_options_name_the_field(fields: dict[str, Any], param: str) -> None:
    assert error("x", **{"tools": [WEATHER], **fields}).param == param


def test_metadata_bounds() -> None:
    with pytest.raises(ValueError, match="at most 16"):
        body(input="x", metadata={str(i): "v" for i in range(17)})
    with pytest.raises(ValueError, match="512"):
        body(input="x", metadata={"k": "v" * 513})


def test_reasoning_effort_switches_thinking_templates() -> None:
    assert convert.template_kwargs(body(input="x")) == {}
    assert convert.template_kwargs(body(input="x", reasoning={"effort": "none"})) == {
        "enable_thinking": False
    }
    assert convert.template_kwargs(body(input="x", reasoning={"effort": "high"})) == {
        "enable_thinking": True
    }


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def stored(store: ResponseStore, response_id: str, **limits: Any) -> None:
    bounds = {"max_entries": 3, "ttl": 60.0, **limits}
    store.put({"id": response_id, "output": [{"id": "o"}]}, [{"id": "i"}], [{"id": "h"}], **bounds)


def test_store_bounds_entries_and_age() -> None:
    clock = Clock()
    store = ResponseStore(clock)
    for name in "abcd":
        stored(store, name)
        clock.now += 10
    assert store.get("a", max_entries=3, ttl=60) is None  # the oldest went first
    entry = store.get("b", max_entries=3, ttl=60)
    assert entry is not None and entry.conversation == [{"id": "h"}, {"id": "o"}]
    clock.now = 71  # "b" was stored at 10
    assert store.get("b", max_entries=3, ttl=60) is None
    assert store.get("c", max_entries=3, ttl=60) is not None
    # Smaller bounds (a hot reload) apply at the next call.
    assert store.get("c", max_entries=1, ttl=60) is None and len(store) == 1
    assert store.delete("d") and not store.delete("d")
    stored(store, "e", max_entries=0)
    assert len(store) == 0


def test_text_format_becomes_an_output_constraint() -> None:
    assert convert.output_constraint(body(input="x")) is None
    assert convert.output_constraint(body(input="x", text={"format": {"type": "text"}})) is None
    plain = convert.output_constraint(body(input="x", text={"format": {"type": "json_object"}}))
    assert plain is not None and (plain.kind, plain.param) == ("json_object", "text.format")
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    fmt = {"type": "json_schema", "name": "x", "schema": schema, "strict": True}
    typed = convert.output_constraint(body(input="x", text={"format": fmt}))
    assert typed is not None and (typed.kind, typed.value) == ("json_schema", schema)
    assert typed.param == "text.format.schema"


@pytest.mark.parametrize(
    ("choice", "named", "names"),
    [
        ("required", False, ["get_weather", "mcp.read"]),
        ({"type": "function", "name": "mcp.read"}, True, ["mcp.read"]),
        (
            {
                "type": "allowed_tools",
                "mode": "required",
                "tools": [{"type": "function", "name": "get_weather"}],
            },
            False,
            ["get_weather"],
        ),
        ("auto", None, None),
        ({"type": "allowed_tools", "mode": "auto", "tools": []}, None, None),
    ],
)
def test_forced_tool_choices(choice: Any, named: bool | None, names: list[str] | None) -> None:
    namespace = {
        "type": "namespace",
        "name": "mcp",
        "tools": [{"type": "function", "name": "read"}],
    }
    request = body(
        input="x", tools=[WEATHER, namespace], tool_choice=choice, parallel_tool_calls=False
    )
    toolset = tools.tool_set(request)
    forced = tools.forced(request, toolset, tools.offered(toolset, request.tool_choice))
    if names is None:
        assert forced is None
        return
    assert forced is not None and forced.named is named and forced.single
    assert [spec.name for spec in forced.tools] == names
    where = {"get_weather": "tools[0].parameters", "mcp.read": "tools[1].tools[0].parameters"}
    assert list(forced.params) == [where[name] for name in names]
