"""The `telemetry` section of vllm-mlx.yaml: OpenTelemetry traces over OTLP/HTTP.

Off unless an endpoint is named, here or in the standard `OTEL_EXPORTER_OTLP_*`
environment variables (telemetry/setup.py decides); docs/operations.md ("Tracing").
"""

from __future__ import annotations

from urllib.parse import urlsplit

from pydantic import field_validator

from vllm_mlx.config.fields import Reload, Section, setting


class TelemetrySettings(Section):
    otlp_endpoint: str | None = setting(
        None,
        Reload.RESTART,
        "Where traces go: an OTLP/HTTP (protobuf) collector, e.g. `http://127.0.0.1:4318` "
        "(`/v1/traces` is added to a URL without a path; one with a path is used as "
        "written). Null: the standard `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or "
        "`OTEL_EXPORTER_OTLP_ENDPOINT` variables, and with neither set tracing is off "
        "(nothing is created or imported). Headers, timeout, compression and TLS files "
        "come from the other `OTEL_EXPORTER_OTLP_*` variables.",
    )
    sampling_ratio: float = setting(
        1.0,
        Reload.RESTART,
        "The share of requests traced (0..1) when the client sent no `traceparent`; a "
        "request with one follows the caller's sampling decision.",
        ge=0,
        le=1,
    )
    service_name: str = setting(
        "vllm-mlx",
        Reload.RESTART,
        "The `service.name` resource attribute the spans carry.",
        min_length=1,
    )

    @field_validator("otlp_endpoint")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        # The exporter would only fail at the first export, long after start-up.
        if value is not None:
            parts = urlsplit(value)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise ValueError(
                    f"{value!r} is not an http(s) URL, e.g. http://127.0.0.1:4318 "
                    f"(an OTLP/HTTP collector)"
                )
        return value
