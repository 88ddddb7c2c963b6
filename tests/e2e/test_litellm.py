"""litellm (PyPI) against a real daemon: its OpenAI and Anthropic providers, embeddings.

litellm is what many gateways and agent frameworks call models through; it builds its
own requests (OpenAI SDK underneath for `openai/`, its own HTTP client for `anthropic/`)
and parses responses into its ModelResponse, so these check our bodies and streams the
way it reads them.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from tests.conftest import DaemonProcess
from tests.e2e.conftest import RESPONSES_KEY
from tests.support.replay import CALLS, QUESTION, TOOL_ARGS, tool_schema

# litellm fetches a model price list from GitHub at import unless told to use its copy.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
import litellm

# Its own pydantic models warn at import; nothing of ours.
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

MODEL = "smollm2-135m-instruct"
ASK = [{"role": "user", "content": "Name a colour."}]


def _openai(daemon: DaemonProcess) -> dict[str, Any]:
    return {"model": f"openai/{MODEL}", "api_base": f"{daemon.base_url}/v1", "api_key": "x"}


def _anthropic(daemon: DaemonProcess) -> dict[str, Any]:
    # Its anthropic/ provider appends /v1/messages to the base itself.
    return {"model": f"anthropic/{MODEL}", "api_base": daemon.base_url, "api_key": "x"}


def test_openai_provider_completion(shared_daemon: DaemonProcess) -> None:
    reply = litellm.completion(**_openai(shared_daemon), messages=ASK, max_tokens=8, temperature=0)
    choice = reply.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert reply.usage.prompt_tokens > 0 and 0 < reply.usage.completion_tokens <= 8


def test_openai_provider_stream_matches_the_plain_reply(shared_daemon: DaemonProcess) -> None:
    plain = litellm.completion(**_openai(shared_daemon), messages=ASK, max_tokens=12, temperature=0)
    chunks = list(
        litellm.completion(
            **_openai(shared_daemon), messages=ASK, max_tokens=12, temperature=0, stream=True
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain.choices[0].message.content
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert reasons[-1] == plain.choices[0].finish_reason


def test_anthropic_provider_uses_the_messages_api(shared_daemon: DaemonProcess) -> None:
    system = [{"role": "system", "content": "Be brief."}]
    reply = litellm.completion(
        **_anthropic(shared_daemon), messages=[*system, *ASK], max_tokens=8, temperature=0
    )
    assert reply.choices[0].message.content
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert reply.usage.prompt_tokens > 0
    plain = litellm.completion(
        **_anthropic(shared_daemon), messages=ASK, max_tokens=8, temperature=0
    )
    streamed = litellm.completion(
        **_anthropic(shared_daemon), messages=ASK, max_tokens=8, temperature=0, stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    assert text == plain.choices[0].message.content


def test_embeddings(shared_daemon: DaemonProcess) -> None:
    result = litellm.embedding(
        model="openai/all-minilm-l6-v2",
        api_base=f"{shared_daemon.base_url}/v1",
        api_key="x",
        input=["a red apple", "a green pear"],
    )
    vectors = [item["embedding"] for item in result.data]
    assert [len(v) for v in vectors] == [384, 384]
    assert result.usage.prompt_tokens > 0


def test_an_error_comes_back_as_litellms_typed_exception(shared_daemon: DaemonProcess) -> None:
    with pytest.raises(litellm.NotFoundError) as raised:
        litellm.completion(
            model="openai/no-such-model",
            api_base=f"{shared_daemon.base_url}/v1",
            api_key="x",
            messages=ASK,
            max_tokens=2,
        )
    assert "no-such-model" in str(raised.value)


def _tools() -> list[dict[str, Any]]:
    return [
        {"type": "function", "function": {"name": name, "parameters": tool_schema(arg)}}
        for name, arg in TOOL_ARGS
    ]


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
@pytest.mark.parametrize("stream", [False, True])
def test_tool_calls_come_back_parsed(
    responses_daemon: DaemonProcess, provider: str, stream: bool
) -> None:
    # `replay` answers with a recorded Hermes-style reply holding two tool calls.
    base = responses_daemon.base_url + ("/v1" if provider == "openai" else "")
    reply = litellm.completion(
        model=f"{provider}/replay",
        api_base=base,
        api_key=RESPONSES_KEY,
        messages=[{"role": "user", "content": QUESTION}],
        tools=_tools(),
        max_tokens=200,
        stream=stream,
    )
    if stream:
        reply = litellm.stream_chunk_builder(list(reply))
    calls = reply.choices[0].message.tool_calls
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == CALLS
    assert all(c.id for c in calls)
    assert reply.choices[0].finish_reason == "tool_calls"
