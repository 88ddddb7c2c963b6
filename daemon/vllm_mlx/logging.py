"""structlog setup: JSON lines when stdout is no terminal (launchd, journald), else console."""

from __future__ import annotations

import logging
import sys
from typing import Any, TextIO

import structlog

from vllm_mlx.config import LoggingSettings

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


def use_json(settings: LoggingSettings) -> bool:
    if settings.format == "auto":
        return not sys.stdout.isatty()
    return settings.format == "json"


def configure_logging(settings: LoggingSettings, stream: TextIO | None = None) -> None:
    """Safe to call again: hot reload swaps level and format in place.

    The daemon logs to stdout (launchd and journald collect it); one-shot commands pass
    stderr so their stdout stays machine-readable (`vllm-mlx models --json`).
    """
    out = stream or sys.stdout
    level = _LEVELS[settings.level]
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if use_json(settings)
        else structlog.dev.ConsoleRenderer(colors=sys.stdout.isatty())
    )
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[*shared, structlog.processors.format_exc_info, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=False,
    )
    # Third-party stdlib loggers (granian, huggingface_hub) go through the same renderer.
    handler = logging.StreamHandler(out)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[
                *shared[1:],
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                renderer,
            ]
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(max(level, logging.WARNING))
