"""The telemetry section and where spans go: the config, else the OTel environment;
with neither, tracing is off and costs nothing (no SDK object, no SDK import)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from vllm_mlx.config.telemetry import TelemetrySettings
from vllm_mlx.telemetry import hooks
from vllm_mlx.telemetry.setup import Target, shown, start_tracing, target

DAEMON_DIR = Path(__file__).resolve().parents[2] / "daemon"


@pytest.mark.parametrize(
    ("endpoint", "url"),
    [
        ("http://127.0.0.1:4318", "http://127.0.0.1:4318/v1/traces"),
        ("http://127.0.0.1:4318/", "http://127.0.0.1:4318/v1/traces"),
        ("https://otel.example.com/custom/traces", "https://otel.example.com/custom/traces"),
    ],
)
def test_the_configured_endpoint_gets_the_traces_path_unless_it_has_one(
    endpoint: str, url: str
) -> None:
    settings = TelemetrySettings(otlp_endpoint=endpoint)
    # The config wins over the environment.
    assert target(settings, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://other:4318"}) == Target(
        url, url
    )


def test_the_standard_variables_turn_tracing_on_and_the_exporter_reads_them() -> None:
    off = TelemetrySettings()
    traces = {
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/x",  # used as written
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://b:4318",
    }
    assert target(off, traces) == Target("http://c:4318/x", None)
    assert target(off, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://b:4318/"}) == Target(
        "http://b:4318/v1/traces", None
    )


@pytest.mark.parametrize(
    "environ",
    [
        {},
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "  "},
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://b:4318", "OTEL_SDK_DISABLED": "true"},
    ],
)
def test_off_without_an_endpoint_or_when_the_sdk_is_disabled(environ: dict[str, str]) -> None:
    assert target(TelemetrySettings(), environ) is None
    assert start_tracing(TelemetrySettings(), environ) is None


def test_disabled_wins_over_the_config_too() -> None:
    settings = TelemetrySettings(otlp_endpoint="http://127.0.0.1:4318")
    assert target(settings, {"OTEL_SDK_DISABLED": "TRUE"}) is None


@pytest.mark.parametrize("endpoint", ["127.0.0.1:4318", "grpc://collector:4317", "http://"])
def test_an_endpoint_that_is_not_an_http_url_is_refused(endpoint: str) -> None:
    with pytest.raises(ValidationError, match="not an http"):
        TelemetrySettings(otlp_endpoint=endpoint)


@pytest.mark.parametrize("ratio", [-0.1, 1.5])
def test_the_sampling_ratio_is_a_share(ratio: float) -> None:
    with pytest.raises(ValidationError, match="sampling_ratio"):
        TelemetrySettings(sampling_ratio=ratio)


def test_the_log_line_never_shows_credentials_in_the_url() -> None:
    assert shown("https://user:secret@otel.example.com:4318/v1/traces") == (
        "https://otel.example.com:4318/v1/traces"
    )
    assert shown("http://[::1]:4318/v1/traces") == "http://[::1]:4318/v1/traces"


def test_the_hooks_do_nothing_outside_a_traced_request() -> None:
    assert hooks.start_request(None, "POST", "/v1/chat/completions", {}) is None
    hooks.end_request(None, "/v1/chat/completions", 200, {})
    with hooks.span("prompt.render") as inside:
        assert inside is None  # the shared null context: nothing was made
    assert hooks.span("a") is hooks.span("b")
    hooks.record("engine.queue", 0.0)
    hooks.tool_call("demo__add", "ok", 0.0)


def test_a_daemon_without_tracing_never_imports_opentelemetry() -> None:
    code = (
        "import sys\n"
        "import vllm_mlx.runtime.daemon\n"
        "from vllm_mlx.config.telemetry import TelemetrySettings\n"
        "from vllm_mlx.telemetry.setup import start_tracing\n"
        "assert start_tracing(TelemetrySettings(), {}) is None\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
    )
    env = {"PYTHONPATH": str(DAEMON_DIR), "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    assert out.stdout.strip() == "[]", out.stderr
