"""A log line to a stream nobody reads any more is dropped, never raised; every record
reaches the stream in one write."""

from __future__ import annotations

import json
import logging
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


class Writes:
    """A stream that keeps each write call apart."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def write(self, text: str) -> int:
        self.calls.append(text)
        return len(text)

    def flush(self) -> None:
        pass


def test_each_record_is_one_write_with_its_newline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ranks of a distributed group share one pipe, and a stdlib logger's thread writes
    beside structlog's (each with its own lock): a record written as text, then newline
    (print()), once left two JSON records on one line (test_distributed_tiny's log)."""
    stream = Writes()
    monkeypatch.setattr(sys, "stdout", stream)
    configure_logging(LoggingSettings(format="json"))
    structlog.get_logger("test").info("request", tokens=8)
    logging.getLogger("granian").warning("listening")
    monkeypatch.undo()
    configure_logging(LoggingSettings())
    assert len(stream.calls) == 2, stream.calls
    for call in stream.calls:
        assert call.endswith("\n") and call.count("\n") == 1
        json.loads(call)
