"""Whether tracing is on, and where its spans go: the config, else the OTel environment.

`telemetry.otlp_endpoint` wins; unset, the standard `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`
(used as written) or `OTEL_EXPORTER_OTLP_ENDPOINT` (plus `/v1/traces`) turn it on, as
for any OpenTelemetry SDK; `OTEL_SDK_DISABLED=true` turns it off. With no endpoint the
SDK is never imported.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import structlog

from vllm_mlx.config.telemetry import TelemetrySettings
from vllm_mlx.telemetry.hooks import Tracing

TRACES_PATH = "/v1/traces"
TRACES_ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_ENDPOINT"
DISABLED_ENV = "OTEL_SDK_DISABLED"

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Target:
    url: str  # where spans go (for the start-up log line)
    exporter_endpoint: str | None  # None: the exporter reads the environment itself


def traces_url(endpoint: str) -> str:
    """A collector's base URL gets the traces path; a URL with a path is kept."""
    parts = urlsplit(endpoint)
    if parts.path in ("", "/"):
        return urlunsplit(parts._replace(path=TRACES_PATH))
    return endpoint


def target(settings: TelemetrySettings, environ: Mapping[str, str]) -> Target | None:
    """Where spans go, or None: tracing is off."""
    if environ.get(DISABLED_ENV, "").strip().lower() == "true":
        return None
    if settings.otlp_endpoint is not None:
        url = traces_url(settings.otlp_endpoint)
        return Target(url, url)
    if traces := environ.get(TRACES_ENDPOINT_ENV, "").strip():
        return Target(traces, None)
    if base := environ.get(ENDPOINT_ENV, "").strip():
        return Target(base.rstrip("/") + TRACES_PATH, None)
    return None


def start_tracing(settings: TelemetrySettings, environ: Mapping[str, str]) -> Tracing | None:
    """A running tracer, or None (off: nothing created, the SDK not even imported)."""
    where = target(settings, environ)
    if where is None:
        return None
    # Imported here, not at the top: the SDK and its exporter (protobuf, requests) cost
    # start-up time and memory that a daemon without tracing should not pay.
    from vllm_mlx.telemetry import otel

    ratio = settings.sampling_ratio
    log.info("tracing", endpoint=shown(where.url), sampling_ratio=ratio)
    return otel.make_tracing(where.exporter_endpoint, ratio, settings.service_name)


def shown(url: str) -> str:
    """`url` without a user:password part, for the log line."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit(parts._replace(netloc=netloc))
