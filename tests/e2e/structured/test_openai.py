"""Structured outputs through the real daemon and the openai SDK.

The bundled SmolLM2 runs at temperature 1.0, so valid output is the mask's doing, not
luck. The daemon (conftest.py) is shared by this package's modules.
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

import httpx
import jsonschema
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel, Field

from tests.conftest import DaemonProcess
from tests.e2e.structured.conftest import ASK, HOT, TOOL_SCHEMAS, TOOLS
from tests.support.schemas import SCHEMAS
from tests.support.spec import validate_openai


@pytest.fixture(scope="module")
def client(daemon: DaemonProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{daemon.base_url}/v1", api_key="unused", max_retries=0)


def _schema_format(name: str, schema: dict[str, Any]) -> Any:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


def test_many_schemas_in_one_batch_all_validate(client: openai.OpenAI) -> None:
    assert len(SCHEMAS) >= 20

    def ask(item: tuple[int, tuple[str, dict[str, Any]]]) -> tuple[str, Any]:
        index, (name, schema) = item
        response = client.chat.completions.create(
            model="smol",
            messages=ASK,  # type: ignore[arg-type]
            max_tokens=128,
            response_format=_schema_format(name, schema),
            # A seed each: a free string at temperature 1 can run long; seeded, the run is
            # the same every time (batch-invariant sampling), so this cannot flake.
            **{**HOT, "seed": index},
        )
        return name, response

    with ThreadPoolExecutor(len(SCHEMAS)) as pool:  # concurrent: one shared batch
        results = list(pool.map(ask, enumerate(SCHEMAS.items())))
    for name, response in results:
        choice = response.choices[0]
        assert choice.finish_reason == "stop", (name, choice.message.content)
        jsonschema.validate(json.loads(choice.message.content), SCHEMAS[name])
    validate_openai("CreateChatCompletionResponse", results[0][1].model_dump(exclude_unset=True))


def test_json_object_is_an_object_and_streaming_stays_token_by_token(
    client: openai.OpenAI,
) -> None:
    def json_object(index: int) -> Any:
        return client.chat.completions.create(
            model="smol",
            messages=ASK,  # type: ignore[arg-type]
            max_tokens=64,
            response_format={"type": "json_object"},
            **{**HOT, "seed": index},  # unseeded, all four sometimes ran past max_tokens
        ).choices[0]

    with ThreadPoolExecutor(4) as pool:
        choices = list(pool.map(json_object, range(4)))
    # Any object is allowed, so one may run past max_tokens; those that end must parse.
    ended = [c for c in choices if c.finish_reason == "stop"]
    assert ended and all((c.message.content or "").startswith("{") for c in choices)
    assert all(isinstance(json.loads(c.message.content or ""), dict) for c in ended)
    stream = client.chat.completions.create(
        model="smol",
        messages=ASK,  # type: ignore[arg-type]
        max_tokens=64,
        response_format=_schema_format("p", SCHEMAS["defs_ref"]),
        stream=True,
        **HOT,
    )
    chunks = list(stream)
    pieces = [
        c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content
    ]
    assert len(pieces) > 3  # not buffered into one chunk
    jsonschema.validate(json.loads("".join(pieces)), SCHEMAS["defs_ref"])
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_regex_choice_and_grammar_through_vllm_extras(
    client: openai.OpenAI, daemon: DaemonProcess
) -> None:
    def chat(extra: dict[str, Any]) -> str:
        response = client.chat.completions.create(
            model="smol",
            messages=ASK,  # type: ignore[arg-type]
            max_tokens=24,
            extra_body=extra,
            **HOT,
        )
        return response.choices[0].message.content or ""

    assert chat({"guided_choice": ["yes", "no"]}) in ("yes", "no")
    assert re.fullmatch(
        r"[A-Z][a-z]{2,5}-[0-9]{2}", chat({"guided_regex": "[A-Z][a-z]{2,5}-[0-9]{2}"})
    )
    assert chat({"structured_outputs": {"choice": ["alpha", "beta"]}}) in ("alpha", "beta")
    grammar = 'start: "(" num ("+" num)? ")"\nnum: /[0-9]{1,2}/\n'
    assert re.fullmatch(
        r"\(\d{1,2}(\+\d{1,2})?\)", chat({"structured_outputs": {"grammar": grammar}})
    )
    value = json.loads(chat({"guided_json": json.dumps(SCHEMAS["array_min_max"])}))
    jsonschema.validate(value, SCHEMAS["array_min_max"])
    completion = client.completions.create(
        model="smol",
        prompt="The answer is",
        max_tokens=8,
        extra_body={"guided_regex": "[0-9]{3}"},
        **HOT,
    )
    assert re.fullmatch(r"[0-9]{3}", completion.choices[0].text)
    assert completion.choices[0].finish_reason == "stop"


class Person(BaseModel):
    name: str = Field(max_length=12)
    age: int = Field(ge=0, le=99)
    role: Literal["admin", "user"]


def test_sdk_parse_with_a_pydantic_model(client: openai.OpenAI) -> None:
    completion = client.chat.completions.parse(
        model="smol",
        messages=[{"role": "user", "content": "Describe a user."}],
        response_format=Person,
        max_tokens=64,
        **HOT,
    )
    parsed = completion.choices[0].message.parsed
    assert isinstance(parsed, Person)


def _check_calls(calls: Any, names: set[str]) -> None:
    assert calls
    for call in calls:
        assert call.function.name in names
        jsonschema.validate(json.loads(call.function.arguments), TOOL_SCHEMAS[call.function.name])


def test_tool_choice_required_and_named_always_call(client: openai.OpenAI) -> None:
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    required = client.chat.completions.create(
        model="smol",
        messages=ask,
        tools=TOOLS,
        tool_choice="required",
        max_tokens=96,
        **HOT,  # type: ignore[arg-type]
    )
    assert required.choices[0].finish_reason == "tool_calls"
    _check_calls(required.choices[0].message.tool_calls, set(TOOL_SCHEMAS))
    single = client.chat.completions.create(
        model="smol",
        messages=ask,  # type: ignore[arg-type]
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=96,
        **HOT,
    )
    assert len(single.choices[0].message.tool_calls or []) == 1
    named = client.chat.completions.create(
        model="smol",
        messages=ask,  # type: ignore[arg-type]
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        max_tokens=48,
        **HOT,
    )
    assert named.choices[0].finish_reason == "tool_calls"
    _check_calls(named.choices[0].message.tool_calls, {"get_time"})
    validate_openai("CreateChatCompletionResponse", named.model_dump(exclude_unset=True))


def test_forced_tool_calls_stream_as_deltas(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="smol",
        messages=[{"role": "user", "content": "Weather?"}],
        tools=TOOLS,  # type: ignore[arg-type]
        tool_choice="required",
        max_tokens=96,
        stream=True,
        **HOT,
    )
    calls: dict[int, dict[str, str]] = {}
    argument_chunks = 0
    reason = None
    for chunk in stream:
        validate_openai("CreateChatCompletionStreamResponse", chunk.model_dump(exclude_unset=True))
        if not chunk.choices:
            continue
        reason = chunk.choices[0].finish_reason or reason
        for delta in chunk.choices[0].delta.tool_calls or []:
            call = calls.setdefault(delta.index, {"name": "", "arguments": ""})
            if delta.function and delta.function.name:
                call["name"] = delta.function.name
            if delta.function and delta.function.arguments:
                call["arguments"] += delta.function.arguments
                argument_chunks += 1
    assert reason == "tool_calls"
    assert argument_chunks > len(calls)  # arguments arrive in pieces
    for call in calls.values():
        jsonschema.validate(json.loads(call["arguments"]), TOOL_SCHEMAS[call["name"]])


def test_pydantic_function_tool_parses(client: openai.OpenAI) -> None:
    class GetWeather(BaseModel):
        city: str = Field(max_length=16)
        unit: Literal["c", "f"]

    completion = client.chat.completions.parse(
        model="smol",
        messages=[{"role": "user", "content": "Weather in Rome?"}],
        tools=[openai.pydantic_function_tool(GetWeather)],
        tool_choice={"type": "function", "function": {"name": "GetWeather"}},
        max_tokens=48,
        **HOT,
    )
    (call,) = completion.choices[0].message.tool_calls or []
    assert isinstance(call.function.parsed_arguments, GetWeather)


def test_max_tokens_cut_is_finish_reason_length(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(
        model="smol",
        messages=ASK,  # type: ignore[arg-type]
        max_tokens=3,
        response_format=_schema_format("p", SCHEMAS["defs_ref"]),
        **HOT,
    )
    assert response.choices[0].finish_reason == "length"
    assert (response.choices[0].message.content or "").startswith("{")


def test_reasoning_model_answer_is_constrained(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(
        model="smol-think",
        messages=ASK,  # type: ignore[arg-type]
        max_tokens=64,
        response_format=_schema_format("p", SCHEMAS["one_of_tagged"]),
        **HOT,
    )
    message = response.choices[0].message
    jsonschema.validate(json.loads(message.content or ""), SCHEMAS["one_of_tagged"])


def _post(
    daemon: DaemonProcess, body: dict[str, Any], path: str = "/v1/chat/completions"
) -> httpx.Response:
    base: dict[str, Any] = {"model": "smol", "messages": ASK, "max_tokens": 8}
    return httpx.post(f"{daemon.base_url}{path}", json={**base, **body}, timeout=60)


BAD: list[tuple[dict[str, Any], str, str]] = [
    (
        {"response_format": _schema_format("x", {"properties": {"a": {"$ref": "#/$defs/gone"}}})},
        "#/properties/a/$ref",
        "response_format.json_schema.schema",
    ),
    (
        {"response_format": _schema_format("x", {"type": "string", "format": "bogus"})},
        "#/format",
        "response_format.json_schema.schema",
    ),
    (
        {"response_format": _schema_format("x", {"type": "array", "uniqueItems": True})},
        "#/uniqueItems: Unimplemented keys",
        "response_format.json_schema.schema",
    ),
    (
        {"response_format": _schema_format("x", {"type": "string", "pattern": "[a-"})},
        "at #/pattern: regex '[a-' at position",
        "response_format.json_schema.schema",
    ),
    ({"guided_regex": "ab(c"}, "position 2: unclosed group", "guided_regex"),
    (
        {"structured_outputs": {"grammar": "start: nope\n"}},
        "unknown name",
        "structured_outputs.grammar",
    ),
    ({"guided_choice": []}, "non-empty list", "guided_choice"),
    ({"guided_json": "{not json"}, "not valid JSON", "guided_json"),
    ({"guided_regex": "a", "guided_choice": ["a"]}, "only one output constraint", "guided_choice"),
    (
        {"response_format": {"type": "json_schema"}},
        "needs a 'json_schema' object",
        "response_format",
    ),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "exactly one", "structured_outputs"),
    (
        {"guided_json": {"type": "object", "description": "x" * 300_000}},
        "at most",
        "guided_json",
    ),
    ({"model": "smol-off", "guided_regex": "a"}, "turned off", "guided_regex"),
    ({"guided_json": [1]}, "must be a JSON schema", "guided_json"),
]


@pytest.mark.parametrize(("body", "message", "param"), BAD)
def test_bad_constraints_get_a_400_naming_the_place(
    daemon: DaemonProcess, body: dict[str, Any], message: str, param: str
) -> None:
    response = _post(daemon, body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert message in error["message"]
    assert error["param"] == param
    assert error["type"] == "invalid_request_error"


def test_bad_constraint_on_completions_and_daemon_still_serves(daemon: DaemonProcess) -> None:
    response = _post(
        daemon, {"prompt": "x", "guided_regex": "(", "messages": None}, "/v1/completions"
    )
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "guided_regex"
    assert (
        _post(daemon, {"guided_choice": ["ok"]}).json()["choices"][0]["message"]["content"] == "ok"
    )


def test_a_schema_nested_thousands_deep_is_a_400(daemon: DaemonProcess) -> None:
    deep = '{"type": "object", "properties": {"a": ' * 5000 + "{}" + "}}" * 5000
    body = '{"model": "smol", "messages": [{"role": "user", "content": "x"}], "guided_json": '
    response = httpx.post(
        f"{daemon.base_url}/v1/chat/completions",
        content=body + deep + "}",
        headers={"content-type": "application/json"},
        timeout=60,
    )
    assert response.status_code == 400
    assert "nests deeper than" in response.json()["error"]["message"]


def test_structured_off_falls_back_to_prompting_for_tool_choice(daemon: DaemonProcess) -> None:
    body = {"model": "smol-off", "tools": TOOLS, "tool_choice": "required", "max_tokens": 4}
    assert _post(daemon, body).status_code == 200


def test_mask_time_metric_is_reported(client: openai.OpenAI, daemon: DaemonProcess) -> None:
    client.chat.completions.create(
        model="smol",
        messages=ASK,
        max_tokens=4,
        extra_body={"guided_choice": ["a", "b"]},  # type: ignore[arg-type]
    )
    text = httpx.get(f"{daemon.base_url}/metrics", timeout=10).text
    counts = [
        sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "vllm_mlx_structured_mask_seconds"
        for sample in family.samples
        if sample.name.endswith("_count") and sample.labels.get("model_name") == "smol"
    ]
    assert counts and counts[0] >= 1
