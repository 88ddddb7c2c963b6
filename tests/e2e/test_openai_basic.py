"""The daemon as a subprocess, driven with the official openai SDK."""

from __future__ import annotations

import openai
import pytest

from tests.conftest import DaemonProcess


@pytest.fixture(scope="module")
def client(shared_daemon: DaemonProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{shared_daemon.base_url}/v1", api_key="unused", max_retries=0)


def test_chat_answers_paris(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=12,
        temperature=0,
    )
    assert "Paris" in (response.choices[0].message.content or "")
    assert response.usage is not None and response.usage.completion_tokens > 0
