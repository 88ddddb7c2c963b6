"""Prefill pacing through the real engine: while a sequence decodes, a long prompt is
read in small chunks between its steps (the stream keeps going), and with nothing
decoding it is read in whole `prefill_step_size` chunks; outputs are unchanged."""

from __future__ import annotations

import asyncio

import pytest

from vllm_mlx.engine.engine import Engine
from vllm_mlx.engine.prefill_pacing import PrefillPacer
from vllm_mlx.engine.scheduler import SchedulerConfig
from vllm_mlx.engine.types import (
    GenerationRequest,
    PromptProcessed,
    SamplingParams,
    SequenceFinished,
    TokensGenerated,
)

SENTENCE = "The inspector wrote that span {i} of the old bridge needs new paint before winter."
# ~620 prompt tokens: two whole 512-token chunks (1,100 tokens cost ~15 s more of CI on a
# 2-core CPU and took no other path).
LONG = " ".join(SENTENCE.format(i=i) for i in range(33))
STREAM = "Count from 1 to 400, separated by commas."


def chat(engine: Engine, text: str) -> list[int]:
    messages = [{"role": "user", "content": text}]
    return list(engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True))


async def stream_during_prefill(engine: Engine) -> tuple[int, list[int], list[int]]:
    """A stream runs; a long prompt arrives. (The stream's tokens while the prompt was
    read, the long request's tokens, the stream's tokens.)"""
    stream = GenerationRequest("stream", chat(engine, STREAM), 120, SamplingParams())
    long = GenerationRequest("long", chat(engine, LONG), 6, SamplingParams())
    streamed: list[int] = []
    reading = asyncio.Event()
    read = asyncio.Event()
    during = 0

    async def run_stream() -> None:
        nonlocal during
        async for event in engine.events(stream):
            if isinstance(event, TokensGenerated):
                streamed.extend(event.tokens)
                if len(streamed) >= 8:
                    reading.set()
                if reading.is_set() and not read.is_set() and long_started:
                    during += len(event.tokens)
            elif isinstance(event, SequenceFinished):
                reading.set()
                return

    long_started = False
    out: list[int] = []

    async def run_long() -> None:
        nonlocal long_started
        await reading.wait()
        long_started = True
        async for event in engine.events(long):
            if isinstance(event, PromptProcessed):
                read.set()
            elif isinstance(event, TokensGenerated):
                out.extend(event.tokens)
            elif isinstance(event, SequenceFinished):
                return

    await asyncio.gather(run_stream(), run_long())
    return during, out, streamed


def test_a_stream_keeps_going_while_a_long_prompt_is_read(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert len(chat(engine, LONG)) > 512  # 2 whole chunks
    observed: list[tuple[float, int, float | None]] = []
    observe = PrefillPacer.observe

    def spy(pacer: PrefillPacer, seconds: float, tokens: int, decode: float | None) -> None:
        observed.append((seconds, tokens, decode))
        observe(pacer, seconds, tokens, decode)

    monkeypatch.setattr(PrefillPacer, "observe", spy)
    paced_during, paced_long, paced_stream = asyncio.run(stream_during_prefill(engine))
    # The steps that decoded and read a chunk timed their decode step apart: its part
    # of the step, not all of it.
    both = [(s, d) for s, tokens, d in observed if tokens and d is not None]
    assert both and all(0 < d < s for s, d in both)
    unpaced = Engine(engine.loaded, SchedulerConfig(max_batch_size=8, max_prefill_stall=None))
    unpaced.start()
    try:
        whole_during, whole_long, whole_stream = asyncio.run(stream_during_prefill(unpaced))
    finally:
        unpaced.stop()
    # Whole 512-token chunks: the stream gets about one token per chunk (2 chunks).
    assert whole_during <= 4
    # Paced: chunks sized to about one decode step's time, many steps while reading.
    assert paced_during >= 3 * max(whole_during, 4), (paced_during, whole_during)
    assert paced_stream == whole_stream  # decoding rows do not depend on chunking
    # Measured: 112 stream tokens (all it had left) against 2, and the same 6 tokens of
    # the long reply.
    assert paced_long == whole_long and len(paced_long) == 6
