"""A forced tool choice together with an output schema, as real clients send it.

The OpenAI Agents SDK sends `tool_choice: "required"` with its `output_type` (as
`text.format` on the Responses API, `response_format` on chat completions), and
instructor's tools modes force a call; OpenAI accepts both at once. The forced turn is a
call (the tool grammar), and the turn after the tool results is held to the schema.
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

import anthropic
import httpx
import instructor
import openai
import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    RunConfig,
    Runner,
    function_tool,
)
from agents.models.openai_provider import OpenAIProvider
from pydantic import BaseModel, Field

from tests.conftest import DaemonProcess
from tests.e2e.conftest import RESPONSES_KEY as KEY

MODEL = "default"  # the bundled model: its calls come from the forced grammar
looked_up: list[str] = []


class Forecast(BaseModel):
    city: str = Field(max_length=24)
    sky: Literal["sunny", "cloudy", "rainy"]


FORECAST_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 24},
        "sky": {"enum": ["sunny", "rainy"]},
    },
    "required": ["city", "sky"],
    "additionalProperties": False,
}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 24}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


@function_tool
def get_weather(city: str) -> str:
    """The current weather in a city."""
    looked_up.append(city)
    return f"Sunny in {city}."


@pytest.fixture(scope="module")
def daemon(responses_daemon: DaemonProcess) -> DaemonProcess:
    return responses_daemon


def _async_client(daemon: DaemonProcess) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{daemon.base_url}/v1", api_key=KEY, max_retries=0)


def _agent(model: Any) -> Agent[Any]:
    return Agent(
        name="forecaster",
        instructions="Look up the weather, then report it.",
        model=model,
        tools=[get_weather],
        output_type=Forecast,
        # Greedy and bounded: the tiny model's words are not the point, the exchange is.
        model_settings=ModelSettings(tool_choice="required", temperature=0, max_tokens=96),
    )


@pytest.mark.parametrize("api", ["responses", "chat"])
def test_agents_sdk_required_tool_and_output_type(daemon: DaemonProcess, api: str) -> None:
    client = _async_client(daemon)
    provider = OpenAIProvider(openai_client=client, use_responses=api == "responses")
    run_config = RunConfig(model_provider=provider, tracing_disabled=True)
    model: Any = MODEL if api == "responses" else OpenAIChatCompletionsModel(MODEL, client)
    looked_up.clear()
    result = asyncio.run(Runner.run(_agent(model), "Weather in Paris?", run_config=run_config))
    # The first turn had to call the tool; the SDK then drops the forced choice, and
    # the answer is held to the schema, so it parses.
    assert looked_up, "the forced tool was never called"
    assert isinstance(result.final_output, Forecast)


@pytest.mark.parametrize("mode", [instructor.Mode.TOOLS, instructor.Mode.RESPONSES_TOOLS])
def test_instructor_tools_modes_return_the_model(
    daemon: DaemonProcess, mode: instructor.Mode
) -> None:
    base = openai.OpenAI(base_url=f"{daemon.base_url}/v1", api_key=KEY, max_retries=0)
    client = instructor.from_openai(base, mode=mode)
    forecast = client.create(
        model=MODEL,
        response_model=Forecast,
        messages=[{"role": "user", "content": "It is sunny in Rome. Give the forecast."}],
        max_retries=0,
        temperature=0,
        **(
            {"max_output_tokens": 96}
            if mode is instructor.Mode.RESPONSES_TOOLS
            else {"max_tokens": 96}
        ),
    )
    assert isinstance(forecast, Forecast)


def _chat(daemon: DaemonProcess, **fields: Any) -> httpx.Response:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": [WEATHER_TOOL],
        "max_tokens": 64,
        "temperature": 0,
        **fields,
    }
    headers = {"Authorization": f"Bearer {KEY}"}
    return httpx.post(
        f"{daemon.base_url}/v1/chat/completions", json=body, headers=headers, timeout=120
    )


def test_chat_forced_call_with_a_format_is_a_call_and_a_bad_format_still_a_400(
    daemon: DaemonProcess,
) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "f", "schema": FORECAST_SCHEMA}}
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        response = _chat(daemon, tool_choice=choice, response_format=fmt)
        assert response.status_code == 200, response.text
        message = response.json()["choices"][0]["message"]
        assert message["tool_calls"][0]["function"]["name"] == "get_weather"
    bad = {
        "type": "json_schema",
        "json_schema": {"name": "f", "schema": {"type": "string", "pattern": "[a-"}},
    }
    response = _chat(daemon, tool_choice="required", response_format=bad)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "response_format.json_schema.schema"


def test_anthropic_forced_tool_with_an_output_format(daemon: DaemonProcess) -> None:
    client = anthropic.Anthropic(base_url=daemon.base_url, api_key=KEY, max_retries=0)
    tool = {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "input_schema": WEATHER_TOOL["function"]["parameters"],  # type: ignore[index]
    }
    message = client.messages.create(
        model=MODEL,
        max_tokens=64,
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[tool],  # type: ignore[list-item]
        tool_choice={"type": "any"},
        # Greedy (in the body: this SDK's create() no longer takes it): the forced grammar
        # allows parallel calls, and an unseeded sample at the default temperature
        # sometimes made two (CI, once).
        extra_body={
            "output_format": {"type": "json_schema", "schema": FORECAST_SCHEMA},
            "temperature": 0,
        },
    )
    assert message.stop_reason == "tool_use"
    assert [block.type for block in message.content] == ["tool_use"]
