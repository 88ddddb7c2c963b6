"""OpenTelemetry traces from a real daemon, received by an OTLP/HTTP receiver in the test.

The daemon exports over OTLP/HTTP (protobuf) to tests/support/otlp.py's receiver, which
decodes with the OpenTelemetry proto package; the tests check span names, parentage
(each child under its request's SERVER span; that span under the client's
`traceparent`), attributes, and that nothing is sent when tracing is off or a request
is not sampled.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import DaemonProcess, launch
from tests.support.mcp_helpers import REPLAY_MCP_CALL, all_ready, stdio_server, wait_for
from tests.support.otlp import Receiver, Span
from vllm_mlx.config.auth import key_digest

SECRET = "sk-tracing-test"
AUTH = {"Authorization": f"Bearer {SECRET}"}
KEY_NAME = "laptop"
SERVICE = "vllm-mlx-under-test"
CHAT = "POST /v1/chat/completions"
ENGINE = {"engine.queue", "engine.prefill", "engine.decode"}
ASK = [{"role": "user", "content": "Name a colour."}]
NO_EOS = {"2": -100}  # SmolLM2's end of text: every reply runs to max_tokens
SLACK_NS = 5_000_000  # monotonic and wall clocks may drift apart a little
FAST_EXPORT = {"OTEL_BSP_SCHEDULE_DELAY": "100"}  # ms: spans leave within a tenth of a second
# Endpoints a developer's shell may have set would decide for the daemon: cleared.
NO_OTEL_ENV = {"OTEL_EXPORTER_OTLP_ENDPOINT": "", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": ""}
MODELS = [
    {"name": "smollm2-135m-instruct", "source": "builtin:smollm2-135m-instruct",
     "aliases": ["default"]},
    # A replayed reply calling demo__add: the daemon runs the MCP tool and generates again.
    {"name": "exec", "source": f"replay:{REPLAY_MCP_CALL}", "enable_auto_tool_choice": True,
     "tool_call_parser": "hermes", "mcp_tools": "execute"},
]  # fmt: skip


def traceparent(sampled: bool = True) -> tuple[str, str, str]:
    """A W3C traceparent header and its trace and span ids."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-{'01' if sampled else '00'}", trace_id, span_id


def started(
    directory: Path,
    cache_dir: Path,
    config: dict[str, Any],
    env: dict[str, str],
) -> DaemonProcess:
    daemon = launch(directory, cache_dir, config, env={**NO_OTEL_ENV, **FAST_EXPORT, **env})
    try:
        daemon.wait_healthy()
    except BaseException:
        daemon.stop()
        raise
    return daemon


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with Receiver() as running:
        yield running


@pytest.fixture(scope="module")
def daemon(
    tmp_path_factory: pytest.TempPathFactory, model_cache_dir: Path, receiver: Receiver
) -> Iterator[DaemonProcess]:
    config = {
        "models": MODELS,
        "auth": {"keys": [{"name": KEY_NAME, "key_sha256": key_digest(SECRET).hex(),
                           "scopes": ["inference", "mcp"]}]},
        "mcp": {"max_tool_rounds": 1, "servers": {"demo": stdio_server()}},
        "telemetry": {"otlp_endpoint": receiver.endpoint, "service_name": SERVICE},
    }  # fmt: skip
    daemon = started(tmp_path_factory.mktemp("tracing"), model_cache_dir, config, {})
    try:
        wait_for(daemon.base_url, all_ready({"demo"}), "demo ready", AUTH)
        yield daemon
    finally:
        daemon.stop()


@pytest.fixture(scope="module")
def client(daemon: DaemonProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{daemon.base_url}/v1", api_key=SECRET, max_retries=0)


def server_span(spans: list[Span], name: str = CHAT) -> Span:
    (found,) = [s for s in spans if s.is_server and s.name == name]
    return found


def children(spans: list[Span], parent: Span) -> dict[str, list[Span]]:
    out: dict[str, list[Span]] = {}
    for span in spans:
        if span.parent_span_id == parent.span_id:
            out.setdefault(span.name, []).append(span)
    return out


def check_engine_spans(under: dict[str, list[Span]], request: Span) -> None:
    """Queue, prefill and decode follow each other inside the request span."""
    (queue,), (prefill,) = under["engine.queue"], under["engine.prefill"]
    (decode,) = under["engine.decode"]
    slack = SLACK_NS
    assert request.start_ns - slack <= queue.start_ns <= queue.end_ns <= prefill.start_ns + slack
    assert prefill.start_ns <= prefill.end_ns <= decode.start_ns + slack
    assert decode.start_ns <= decode.end_ns <= request.end_ns + slack


def test_a_chat_request_is_a_server_span_with_the_engine_phases(
    client: openai.OpenAI, receiver: Receiver
) -> None:
    mark = len(receiver.spans)
    reply = client.chat.completions.create(
        model="default", messages=ASK, max_tokens=6, logit_bias=NO_EOS
    )

    def chat_arrived(spans: list[Span]) -> bool:
        return any(s.is_server and s.name == CHAT for s in spans[mark:])

    request = server_span(receiver.wait_for(chat_arrived, "the chat request's span")[mark:])
    spans = receiver.trace(request.trace_id, CHAT, ENGINE | {"prompt.render"})
    assert request.parent_span_id == ""  # no traceparent: a root, sampled by the ratio (1)
    # The start-up's /health polls came first, and probes are not traced.
    assert not [s for s in receiver.spans if "/health" in s.name]
    assert request.resource["service.name"] == SERVICE
    assert reply.usage is not None
    attributes = request.attributes
    assert attributes["http.request.method"] == "POST"
    assert attributes["http.route"] == "/v1/chat/completions"
    assert attributes["http.response.status_code"] == 200
    assert attributes["gen_ai.request.model"] == "default"
    assert attributes["vllm_mlx.key"] == KEY_NAME
    assert SECRET not in json.dumps([s.attributes for s in spans])  # the name, never the key
    assert attributes["gen_ai.usage.input_tokens"] == reply.usage.prompt_tokens
    assert attributes["gen_ai.usage.output_tokens"] == reply.usage.completion_tokens == 6
    assert attributes["gen_ai.usage.cache_read.input_tokens"] >= 0
    assert attributes["gen_ai.response.finish_reasons"] == ["length"]
    under = children(spans, request)
    assert set(under) == ENGINE | {"prompt.render"}
    check_engine_spans(under, request)
    (prefill,), (decode,) = under["engine.prefill"], under["engine.decode"]
    assert prefill.attributes["gen_ai.usage.input_tokens"] == reply.usage.prompt_tokens
    assert decode.attributes["gen_ai.usage.output_tokens"] == 6
    (render,) = under["prompt.render"]
    assert request.start_ns <= render.start_ns <= render.end_ns <= prefill.start_ns + SLACK_NS


def test_a_streamed_request_continues_the_clients_trace(
    client: openai.OpenAI, receiver: Receiver
) -> None:
    header, trace_id, parent_id = traceparent()
    stream = client.chat.completions.create(
        model="default",
        messages=ASK,
        max_tokens=5,
        logit_bias=NO_EOS,
        stream=True,
        stream_options={"include_usage": True},
        extra_headers={"traceparent": header},
    )
    usage = [chunk.usage for chunk in stream if chunk.usage is not None]
    spans = receiver.trace(trace_id, CHAT, ENGINE)
    request = server_span(spans)
    assert request.parent_span_id == parent_id  # a child of the caller's span
    assert request.attributes["gen_ai.usage.output_tokens"] == usage[0].completion_tokens == 5
    assert request.attributes["http.response.status_code"] == 200
    under = children(spans, request)
    assert ENGINE | {"prompt.render"} <= set(under)
    check_engine_spans(under, request)
    # Every span of the trace hangs under the request span (none is orphaned).
    assert all(s.parent_span_id == request.span_id for s in spans if s is not request)


def test_a_structured_output_request_has_its_compile_span(
    client: openai.OpenAI, receiver: Receiver
) -> None:
    header, trace_id, _ = traceparent()
    schema = {
        "type": "object",
        "properties": {"colour": {"type": "string", "maxLength": 8}},
        "required": ["colour"],
        "additionalProperties": False,
    }
    client.chat.completions.create(
        model="default",
        messages=ASK,
        max_tokens=24,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "colour", "schema": schema, "strict": True},
        },
        extra_headers={"traceparent": header},
    )
    spans = receiver.trace(trace_id, CHAT, {"structured_output.compile", "engine.decode"})
    request = server_span(spans)
    (compile_span,) = children(spans, request)["structured_output.compile"]
    assert compile_span.attributes["vllm_mlx.constraint.kind"] == "json_schema"
    assert request.start_ns <= compile_span.start_ns <= compile_span.end_ns <= request.end_ns


def test_mcp_tool_calls_in_a_generation_are_child_spans(
    client: openai.OpenAI, receiver: Receiver
) -> None:
    header, trace_id, _ = traceparent()
    client.chat.completions.create(
        model="exec",
        messages=[{"role": "user", "content": "What is 2 + 3?"}],
        max_tokens=60,
        extra_headers={"traceparent": header},
    )
    spans = receiver.trace(trace_id, CHAT, {"execute_tool demo__add", "engine.decode"})
    request = server_span(spans)
    under = children(spans, request)
    (tool,) = under["execute_tool demo__add"]  # max_tool_rounds 1: one round ran here
    assert tool.attributes["gen_ai.tool.name"] == "demo__add"
    assert tool.attributes["vllm_mlx.mcp.outcome"] == "ok"
    # The generation before the tool ran and the one after it: two of each phase.
    assert len(under["engine.decode"]) == len(under["engine.prefill"]) == 2
    first, second = sorted(under["engine.decode"], key=lambda s: s.start_ns)
    assert first.end_ns <= tool.start_ns and tool.end_ns <= second.start_ns
    assert request.attributes["gen_ai.request.model"] == "exec"


def test_the_mcp_execute_route_traces_its_tool_call(
    daemon: DaemonProcess, receiver: Receiver
) -> None:
    header, trace_id, _ = traceparent()
    response = httpx.post(
        f"{daemon.base_url}/v1/mcp/execute",
        json={"tool_name": "demo__add", "arguments": {"a": 1, "b": 2}},
        headers={**AUTH, "traceparent": header},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    name = "POST /v1/mcp/execute"
    spans = receiver.trace(trace_id, name, {"execute_tool demo__add"})
    request = server_span(spans, name)
    assert request.attributes["vllm_mlx.key"] == KEY_NAME
    assert children(spans, request).keys() == {"execute_tool demo__add"}


def test_an_unsampled_traceparent_is_not_traced(
    client: openai.OpenAI, daemon: DaemonProcess, receiver: Receiver
) -> None:
    unsampled, dropped, _ = traceparent(sampled=False)
    client.chat.completions.create(
        model="default", messages=ASK, max_tokens=2, extra_headers={"traceparent": unsampled}
    )
    header, refused_trace, _ = traceparent()
    refused = httpx.get(f"{daemon.base_url}/v1/models", headers={"traceparent": header})
    assert refused.status_code == 401  # no key: refused, and traced as such
    # Spans leave in the order they end: once the later request's span is in, the
    # unsampled one would have been too.
    sampled, kept, _ = traceparent()
    client.chat.completions.create(
        model="default", messages=ASK, max_tokens=2, extra_headers={"traceparent": sampled}
    )
    spans = receiver.trace(kept, CHAT, ENGINE)
    assert not [s for s in receiver.spans if s.trace_id == dropped]
    assert server_span(spans).parent_span_id != ""
    (unauthorized,) = [s for s in receiver.spans if s.trace_id == refused_trace]
    assert unauthorized.name == "GET /v1/models"
    assert unauthorized.attributes["http.response.status_code"] == 401
    assert "vllm_mlx.key" not in unauthorized.attributes


def test_nothing_is_sent_when_tracing_is_off(tmp_path: Path, model_cache_dir: Path) -> None:
    with Receiver() as receiver:
        # The batch settings are there, the endpoint is not: tracing stays off.
        daemon = started(tmp_path, model_cache_dir, {}, {})
        try:
            reply = httpx.post(
                f"{daemon.base_url}/v1/chat/completions",
                json={"model": "default", "messages": ASK, "max_tokens": 2},
                headers={"traceparent": traceparent()[0]},
                timeout=60,
            )
            assert reply.status_code == 200
        finally:
            # A stop flushes every queued span: after it, what was not sent never will be.
            assert daemon.stop() == 0
        assert receiver.posts == 0
        assert '"tracing"' not in daemon.log_text()


def test_sampling_ratio_zero_traces_only_sampled_callers(
    tmp_path: Path, model_cache_dir: Path
) -> None:
    with Receiver() as receiver:
        # The endpoint from the standard variable, as any OpenTelemetry SDK reads it.
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint}
        config = {"telemetry": {"sampling_ratio": 0.0}}
        daemon = started(tmp_path, model_cache_dir, config, env)
        try:
            body = {"model": "default", "messages": ASK, "max_tokens": 2}
            url = f"{daemon.base_url}/v1/chat/completions"
            assert httpx.post(url, json=body, timeout=60).status_code == 200
            header, trace_id, parent_id = traceparent()
            headers = {"traceparent": header}
            assert httpx.post(url, json=body, headers=headers, timeout=60).status_code == 200
            spans = receiver.trace(trace_id, CHAT, ENGINE)
            assert server_span(spans).parent_span_id == parent_id
        finally:
            assert daemon.stop() == 0
        # The first request had no traceparent: the ratio dropped it.
        assert {s.trace_id for s in receiver.spans} == {trace_id}
        assert f"{receiver.endpoint}/v1/traces" in daemon.log_text()
