"""A log line to a stream nobody reads any more is dropped, never raised."""

from __future__ import annotations

import os
import sys

import pytest
import structlog

from vllm_mlx.config.sections import LoggingSettings
from vllm_mlx.logging import configure_logging


@pytest.mark.parametrize("closed", ["pipe", "file"])
def test_logging_to_a_closed_stream_never_raises(
    monkeypatch: pytest.MonkeyPatch, closed: str
) -> None:
    """The daemon once ignored SIGTERM once its stdout pipe was closed: the drain's log
    line raised BrokenPipeError inside the signal handler."""
    read_end, write_end = os.pipe()
    stream = os.fdopen(write_end, "w", buffering=1)
    if closed == "pipe":
        os.close(read_end)  # the reader is gone: writes raise BrokenPipeError
    else:
        os.close(read_end)
        stream.close()  # writes raise ValueError
    monkeypatch.setattr(sys, "stdout", stream)
    configure_logging(LoggingSettings(format="json"))
    structlog.get_logger("test").info("draining", signal="SIGTERM")  # must not raise
    monkeypatch.undo()
    configure_logging(LoggingSettings())
