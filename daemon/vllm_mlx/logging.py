"""structlog setup: JSON lines when stdout is no terminal (launchd, journald), else console."""

from __future__ import annotations

import contextlib
import logging
import sys
from typing import Any, TextIO

import structlog

from vllm_mlx.config.sections import LoggingSettings

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


class _CurrentStream:
    """sys.stdout or sys.stderr as it is at each write, not as it was when logging was
    set up: whoever swaps the stream later (tests, a redirecting parent) is followed."""

    def __init__(self, name: str) -> None:
        self._name = name

    def write(self, text: str) -> int:
        stream: TextIO = getattr(sys, self._name)
        try:
            return stream.write(text)
        except (OSError, ValueError):
            # Nobody reads the stream any more (a closed pipe, a closed file): the line is
            # lost, but a log call must never fail its caller (a signal handler's drain).
            return 0

    def flush(self) -> None:
        stream: TextIO = getattr(sys, self._name)
        with contextlib.suppress(OSError, ValueError):
            stream.flush()


def configure_logging(settings: LoggingSettings, to_stderr: bool = False) -> None:
    """Safe to call again: hot reload swaps level and format in place.

    The daemon logs to stdout (launchd and journald collect it); one-shot commands log
    to stderr so their stdout stays machine-readable (`vllm-mlx models --json`).
    """
    out: Any = _CurrentStream("stderr" if to_stderr else "stdout")
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
        # One write per record, its newline included: print() writes the newline
        # separately, and a stdlib record written from another thread between the two
        # (the handler below has its own lock) left two JSON records on one line.
        logger_factory=structlog.WriteLoggerFactory(out),
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
