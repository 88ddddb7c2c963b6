"""POST /v1/responses and the stored responses through a real daemon, with the openai SDK.

Text comes from the real bundled model; tool calls and reasoning from the test-only
`replay:` source (the real model runs, its logits forced to a recorded Hermes/Qwen3
reply). Every response body and every stream event is checked against the OpenAI spec.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from pydantic import BaseModel

from tests.conftest import DaemonProcess
from tests.e2e.conftest import RESPONSES_KEY as KEY
from tests.e2e.ops_support import (
    logged_statuses,
    open_raw_request,
    read_stream_id,
    scrape,
    value,
    wait_for,
)
from tests.support.replay import CALLS, FIXTURES, QUESTION, THOUGHT
from tests.support.responses import check_stream, parse_sse, validate_response
from tests.support.spec import validate_openai

ANSWER = json.loads((FIXTURES / "anthropic_answer.json").read_text())["text"]
TOOLS: list[Any] = [
    {
        "type": "function",
        "name": name,
        "description": f"{name} tool",
        "parameters": {"type": "object", "properties": {next(iter(args)): {"type": "string"}}},
    }
    for name, args in CALLS
]


@pytest.fixture(scope="module")
def daemon(responses_daemon: DaemonProcess) -> DaemonProcess:
    return responses_daemon


@pytest.fixture(scope="module")
def client(daemon: DaemonProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{daemon.base_url}/v1", api_key=KEY, max_retries=0)


def post(daemon: DaemonProcess, body: dict[str, Any]) -> httpx.Response:
    headers = {"Authorization": f"Bearer {KEY}"}
    return httpx.post(f"{daemon.base_url}/v1/responses", json=body, headers=headers, timeout=120)


def dump(model: Any) -> dict[str, Any]:
    """What the server sent, as the SDK parsed it (less the SDK's own `parsed` fields)."""
    data: dict[str, Any] = _without_parsed(
        model.model_dump(exclude_unset=True, mode="json", warnings=False, by_alias=True)
    )
    return data


def _without_parsed(node: Any) -> Any:
    if isinstance(node, dict):
        return {
            k: _without_parsed(v)
            for k, v in node.items()
            if k not in ("parsed", "parsed_arguments")
        }
    if isinstance(node, list):
        return [_without_parsed(v) for v in node]
    return node


def test_create_text_with_instructions(client: openai.OpenAI) -> None:
    response = client.responses.create(
        model="default",
        input="What is the capital of France?",
        instructions="Answer in one short sentence.",
        max_output_tokens=24,
        temperature=0,
        metadata={"suite": "responses"},
    )
    validate_response(dump(response))
    assert response.status == "completed" and response.object == "response"
    assert "Paris" in response.output_text
    assert response.instructions == "Answer in one short sentence."
    assert response.metadata == {"suite": "responses"}
    usage = response.usage
    assert usage is not None and usage.input_tokens > 0
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens


def test_stream_text_events(client: openai.OpenAI, daemon: DaemonProcess) -> None:
    with client.responses.stream(
        model="default", input="What is the capital of France?", max_output_tokens=24, temperature=0
    ) as stream:
        events = [dump(event) for event in stream]
        final = stream.get_final_response()
    response = check_stream(events)
    assert response["id"] == final.id and final.status == "completed"
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert deltas and deltas == final.output_text
    # The raw SSE: every `event:` name is the JSON type (parse_sse checks it).
    raw = post(daemon, {"model": "default", "input": "Hi", "stream": True, "max_output_tokens": 4})
    assert raw.headers["content-type"].startswith("text/event-stream")
    cut = check_stream(parse_sse(raw.text))
    assert cut["status"] == "incomplete"
    assert cut["incomplete_details"] == {"reason": "max_output_tokens"}


def test_previous_response_id_store_and_cached_tokens(client: openai.OpenAI) -> None:
    first = client.responses.create(
        model="default",
        input="What is the capital of France?",
        max_output_tokens=24,
        temperature=0,
    )
    second = client.responses.create(
        model="default",
        input="And of Germany?",
        previous_response_id=first.id,
        max_output_tokens=24,
        temperature=0,
    )
    validate_response(dump(second))
    assert second.previous_response_id == first.id
    assert first.usage is not None and second.usage is not None
    # The first turn (question and answer) is part of the second prompt, and the
    # prefix cache supplied what the first request had already computed.
    assert second.usage.input_tokens > first.usage.total_tokens
    assert second.usage.input_tokens_details.cached_tokens > 0
    stored = client.responses.retrieve(first.id)
    validate_response(dump(stored))
    assert stored.output_text == first.output_text
    items = client.responses.input_items.list(second.id)
    assert [item.type for item in items.data] == ["message"]
    assert dump(items.data[0])["content"] == [{"type": "input_text", "text": "And of Germany?"}]
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError) as gone:
        client.responses.create(model="default", input="x", previous_response_id=first.id)
    assert first.id in gone.value.message
    assert gone.value.body["param"] == "previous_response_id"  # type: ignore[index]


def test_store_false_is_not_kept(client: openai.OpenAI) -> None:
    response = client.responses.create(
        model="default", input="Hi", store=False, max_output_tokens=4
    )
    assert response.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)


def test_function_tool_round_trip_with_reasoning(client: openai.OpenAI) -> None:
    first = client.responses.create(
        model="replay", input=QUESTION, tools=TOOLS, max_output_tokens=120
    )
    validate_response(dump(first))
    kinds = [item.type for item in first.output]
    assert kinds == ["reasoning", "message", "function_call", "function_call"]
    reasoning = dump(first.output[0])
    assert reasoning["summary"] == [{"type": "summary_text", "text": THOUGHT}]
    calls = [item for item in first.output if item.type == "function_call"]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == CALLS
    assert first.usage is not None and first.usage.output_tokens_details.reasoning_tokens > 0
    outputs = [
        {"type": "function_call_output", "call_id": call.call_id, "output": f"{call.name}: ok"}
        for call in calls
    ]
    # Stateful: the stored turn plus the tool results.
    answer = client.responses.create(
        model="replay-answer",
        previous_response_id=first.id,
        input=outputs,
        tools=TOOLS,
        max_output_tokens=40,
    )
    validate_response(dump(answer))
    assert answer.output_text == ANSWER
    assert answer.usage is not None and answer.usage.input_tokens > first.usage.input_tokens
    # Stateless: the client sends the earlier output items back itself (reasoning too).
    replayed = [dump(item) for item in first.output]
    stateless = client.responses.create(
        model="replay-answer",
        input=[{"role": "user", "content": QUESTION}, *replayed, *outputs],
        tools=TOOLS,
        store=False,
        max_output_tokens=40,
    )
    assert stateless.output_text == ANSWER
    assert stateless.usage is not None
    assert stateless.usage.input_tokens == answer.usage.input_tokens


def test_stream_tool_calls_and_reasoning(client: openai.OpenAI) -> None:
    with client.responses.stream(
        model="replay",
        input=QUESTION,
        tools=TOOLS,
        max_output_tokens=120,
        reasoning={"effort": "low", "summary": "auto"},
    ) as stream:
        events = [dump(event) for event in stream]
        final = stream.get_final_response()
    response = check_stream(events)
    types = {e["type"] for e in events}
    assert {
        "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
    } <= types
    arguments = [
        e["arguments"] for e in events if e["type"] == "response.function_call_arguments.done"
    ]
    assert [json.loads(a) for a in arguments] == [args for _, args in CALLS]
    assert [item["type"] for item in response["output"]] == [item.type for item in final.output]


def test_parallel_tool_calls_false_and_tool_choice(client: openai.OpenAI) -> None:
    single = client.responses.create(
        model="replay",
        input=QUESTION,
        tools=TOOLS,
        parallel_tool_calls=False,
        max_output_tokens=120,
    )
    assert [item.name for item in single.output if item.type == "function_call"] == ["get_weather"]
    # tool_choice none: no tools offered, so the calls stay text.
    plain = client.responses.create(
        model="replay", input=QUESTION, tools=TOOLS, tool_choice="none", max_output_tokens=120
    )
    assert all(item.type != "function_call" for item in plain.output)
    assert "<tool_call>" in plain.output_text


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": [{"type": "computer_call", "id": "x"}]}, "input[0].type"),
        (
            {"input": [{"type": "function_call_output", "call_id": "c9", "output": "x"}]},
            "input[0].call_id",
        ),
        (
            {"input": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "input[0].content[0].type",
        ),
        ({"input": "x", "tools": [{"type": "function"}]}, "tools[0].name"),
        ({"input": "x", "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice.name"),
        (
            {
                "input": "x",
                "text": {
                    "format": {"type": "json_schema", "name": "x", "schema": {"type": "nonsense"}}
                },
            },
            "text.format.schema",
        ),
        ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": "x", "temperature": 3}, "temperature"),
        ({}, "input"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(
    daemon: DaemonProcess, body: dict[str, Any], param: str
) -> None:
    response = post(daemon, {"model": "default", **body})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"


def test_hosted_tools_are_left_out_with_one_warning(daemon: DaemonProcess) -> None:
    hosted = [{"type": t} for t in ("web_search", "file_search", "code_interpreter")]
    response = post(
        daemon,
        {
            "model": "default",
            "input": "Hi",
            "max_output_tokens": 4,
            "tools": [*hosted, {"type": "image_generation"}, TOOLS[0]],
        },
    )
    assert response.status_code == 200, response.text
    request_id = response.json()["id"]

    def warnings() -> list[dict[str, Any]] | None:
        lines = [json.loads(line) for line in daemon.log_text().splitlines() if request_id in line]
        found = [line for line in lines if line.get("level") == "warning"]
        return found if any(line.get("event") == "request" for line in lines) else None

    found = wait_for(warnings, 30, "the request's log lines")
    assert len(found) == 1
    assert found[0]["tool_types"] == [
        "code_interpreter",
        "file_search",
        "image_generation",
        "web_search",
    ]


def test_auth_metrics_and_status_cover_the_route(
    daemon: DaemonProcess, client: openai.OpenAI
) -> None:
    refused = httpx.post(f"{daemon.base_url}/v1/responses", json={"model": "default", "input": "x"})
    assert refused.status_code == 401 and "error" in refused.json()
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(
            base_url=f"{daemon.base_url}/v1", api_key="wrong", max_retries=0
        ).responses.retrieve("resp_x")
    headers = {"Authorization": f"Bearer {KEY}"}
    before = scrape(daemon, headers)
    client.responses.create(model="default", input="Hi", max_output_tokens=4)
    route = {"route": "/v1/responses", "method": "POST", "status": "2xx"}

    def counted() -> float | None:
        after = scrape(daemon, headers)
        moved = value(after, "vllm_mlx_http_requests_total", **route) - value(
            before, "vllm_mlx_http_requests_total", **route
        )
        return moved if moved >= 1 else None

    assert wait_for(counted, 30, "the /v1/responses request to be counted") == 1
    status = httpx.get(f"{daemon.base_url}/v1/status", headers=headers)
    assert status.status_code == 200


def test_client_disconnect_aborts_the_stream(daemon: DaemonProcess) -> None:
    body = {
        "model": "default",
        "input": "Write a long essay about the sea.",
        "max_output_tokens": 2000,
        "stream": True,
    }
    sock = open_raw_request(daemon, "/v1/responses", body, {"Authorization": f"Bearer {KEY}"})
    response_id = read_stream_id(sock)  # response.created carries the response's id
    sock.close()

    def aborted() -> int | None:
        return logged_statuses(daemon).get(response_id)

    assert wait_for(aborted, 60, "the abandoned request's log line") == 499


def test_input_items_pages(client: openai.OpenAI, daemon: DaemonProcess) -> None:
    turns = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Bye"},
    ]
    response = client.responses.create(model="default", input=turns, max_output_tokens=4)  # type: ignore[arg-type]
    url = f"{daemon.base_url}/v1/responses/{response.id}/input_items"
    headers = {"Authorization": f"Bearer {KEY}"}
    first = httpx.get(url, params={"limit": 3, "order": "asc"}, headers=headers).json()
    validate_openai("ResponseItemList", first)
    assert [item["role"] for item in first["data"]] == ["developer", "user", "assistant"]
    assert first["has_more"] is True and first["last_id"] == first["data"][-1]["id"]
    rest = httpx.get(
        url, params={"limit": 3, "order": "asc", "after": first["last_id"]}, headers=headers
    ).json()
    assert [item["role"] for item in rest["data"]] == ["user"] and rest["has_more"] is False
    newest = client.responses.input_items.list(response.id, limit=1)  # default order: desc
    assert [item.role for item in newest.data] == ["user"]  # type: ignore[union-attr]
    bad = httpx.get(url, params={"limit": 0}, headers=headers)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "limit"


class City(BaseModel):
    name: str
    country: str


WEATHER_TOOL: Any = {
    "type": "function",
    "name": "get_weather",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
    "strict": True,
}


def test_text_format_json_schema_and_json_object(client: openai.OpenAI) -> None:
    parsed = client.responses.parse(
        model="default",
        input="What is the capital of France?",
        text_format=City,
        max_output_tokens=60,
        temperature=0,
    )
    validate_response(dump(parsed))
    assert parsed.status == "completed"
    assert isinstance(parsed.output_parsed, City)
    assert parsed.text.format.type == "json_schema"  # type: ignore[union-attr]
    loose = client.responses.create(
        model="default",
        input="Describe Paris as JSON.",
        text={"format": {"type": "json_object"}},
        max_output_tokens=60,
        temperature=0,
    )
    if loose.status == "completed":
        assert isinstance(json.loads(loose.output_text), dict)


def test_forced_tool_choice_streams_a_call(client: openai.OpenAI) -> None:
    with client.responses.stream(
        model="default",
        input="What is the weather in Paris?",
        tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=60,
        temperature=0,
    ) as stream:
        events = [dump(event) for event in stream]
    response = check_stream(events)
    calls = [item for item in response["output"] if item["type"] == "function_call"]
    assert [call["name"] for call in calls] == ["get_weather"]
    assert isinstance(json.loads(calls[0]["arguments"])["city"], str)
    required = client.responses.create(
        model="default",
        input="What is the weather in Paris?",
        tools=[WEATHER_TOOL],
        tool_choice="required",
        max_output_tokens=60,
        temperature=0,
    )
    assert [item.type for item in required.output] == ["function_call"]
