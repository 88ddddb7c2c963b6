"""Constrained decoding in the engine, with the real bundled model at temperature 1."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest

from vllm_mlx.config.model import ModelSettings
from vllm_mlx.engine.constraints import (
    CompiledConstraint,
    Constraint,
    ConstraintCompiler,
    ConstraintError,
    ReasoningGate,
)
from vllm_mlx.engine.engine import Engine
from vllm_mlx.engine.output import generate_text
from vllm_mlx.engine.scheduler import SchedulerConfig
from vllm_mlx.engine.types import (
    Finished,
    FinishReason,
    GenerationRequest,
    SamplingParams,
    SequenceFinished,
    TextDelta,
    TokensGenerated,
)
from vllm_mlx.models.loader import load_model

HOT = SamplingParams(temperature=1.0, seed=1234)  # hot but reproducible


@pytest.fixture(scope="module")
def engine(model_cache_dir: Path) -> Iterator[Engine]:
    settings = ModelSettings(name="smol", source="builtin:smollm2-135m-instruct")
    engine = Engine(load_model(settings, model_cache_dir), SchedulerConfig(max_batch_size=8))
    engine.start()
    yield engine
    engine.stop()


def chat_tokens(engine: Engine, text: str) -> list[int]:
    messages = [{"role": "user", "content": text}]
    return list(engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True))


def compile_(engine: Engine, constraint: Constraint) -> CompiledConstraint:
    return engine.constraints.compile(constraint)


@dataclass
class Recording:
    """Wraps a request's real mask processor; keeps each step's allowed token ids."""

    compiled: CompiledConstraint
    gate: ReasoningGate | None = None
    allowed: list[set[int]] = field(default_factory=list)

    def make_processor(self) -> Callable[[Any, Any], Any]:
        inner = self.compiled.make_processor(self.gate)

        def process(tokens: mx.array, logits: mx.array) -> mx.array:
            out = inner(tokens, logits)
            finite = np.array(mx.isfinite(out[0]))
            self.allowed.append({int(i) for i in np.flatnonzero(finite)})
            return out

        return process


async def _tokens(engine: Engine, request: GenerationRequest) -> tuple[list[int], FinishReason]:
    tokens: list[int] = []
    async for event in engine.events(request):
        if isinstance(event, TokensGenerated):
            tokens.extend(event.tokens)
        elif isinstance(event, SequenceFinished):
            return tokens, event.reason
    raise AssertionError("no end")


async def _text(engine: Engine, request: GenerationRequest) -> tuple[str, Finished]:
    parts: list[str] = []
    async for event in generate_text(engine, request):
        if isinstance(event, TextDelta):
            parts.append(event.text)
        else:
            return "".join(parts), event
    raise AssertionError("no end")


def request(
    engine: Engine, rid: str, text: str, constraint: Any, max_tokens: int = 48
) -> GenerationRequest:
    return GenerationRequest(rid, chat_tokens(engine, text), max_tokens, HOT, constraint=constraint)


def test_sampled_tokens_are_always_in_the_allowed_set(engine: Engine) -> None:
    compiled = compile_(engine, Constraint("regex", r"[0-9]{2,4}-[a-z]{2,6}( ok)?"))
    recordings = [Recording(compiled) for _ in range(3)]
    requests = [
        request(engine, f"mask-{i}", "Write anything you like.", rec)
        for i, rec in enumerate(recordings)
    ]

    async def main() -> list[tuple[list[int], FinishReason]]:
        return list(await asyncio.gather(*(_tokens(engine, r) for r in requests)))

    eos = engine.eos_token_ids
    for (tokens, reason), rec in zip(asyncio.run(main()), recordings, strict=True):
        assert reason is FinishReason.STOP
        # One mask per sampled token, then the (unreported) EOS; mlx-lm computes one
        # step ahead, so a last mask may follow for a token that is thrown away.
        assert len(tokens) + 1 <= len(rec.allowed) <= len(tokens) + 2
        for step, token in enumerate(tokens):
            assert token in rec.allowed[step], (step, token)
        assert rec.allowed[len(tokens)] & eos  # the end was allowed where it came
        text = engine.tokenizer.decode(tokens)
        assert re.fullmatch(r"[0-9]{2,4}-[a-z]{2,6}( ok)?", text), text


def test_schemas_and_free_requests_share_a_batch(engine: Engine) -> None:
    schema_a = {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 3, "maximum": 9}},
        "required": ["n"],
        "additionalProperties": False,
    }
    schema_b = {"type": "array", "items": {"enum": ["red", "blue"]}, "minItems": 2, "maxItems": 3}
    a = compile_(engine, Constraint("json_schema", schema_a)).bind(None)
    b = compile_(engine, Constraint("json_schema", schema_b)).bind(None)

    def free(rid: str) -> GenerationRequest:  # greedy: the same text alone or batched
        return GenerationRequest(rid, chat_tokens(engine, "Say hello."), 8)

    requests = [
        request(engine, "a", "Give a number.", a),
        free("free"),
        request(engine, "b", "List colors.", b),
        request(engine, "a2", "Another number.", a),
    ]

    async def main() -> list[tuple[str, Finished]]:
        return list(await asyncio.gather(*(_text(engine, r) for r in requests)))

    (ta, fa), (free_text, _), (tb, fb), (ta2, _) = asyncio.run(main())
    alone, _ = asyncio.run(_text(engine, free("alone")))
    assert free_text == alone  # the others' masks never touched its row
    assert fa.reason is fb.reason is FinishReason.STOP
    for text in (ta, ta2):
        value = json.loads(text)
        assert set(value) == {"n"} and 3 <= value["n"] <= 9
    colors = json.loads(tb)
    assert 2 <= len(colors) <= 3 and set(colors) <= {"red", "blue"}


def test_max_tokens_cuts_json_with_finish_length(engine: Engine) -> None:
    schema = {
        "type": "object",
        "properties": {"s": {"type": "string", "minLength": 200}},
        "required": ["s"],
    }
    constraint = compile_(engine, Constraint("json_schema", schema)).bind(None)
    text, finished = asyncio.run(
        _text(engine, request(engine, "cut", "Write.", constraint, max_tokens=5))
    )
    assert finished.reason is FinishReason.LENGTH
    assert text.startswith("{")


def test_reasoning_stays_free_until_the_close_marker(engine: Engine) -> None:
    # A stand-in reasoning marker the model says on its own: "\n" ends "thinking".
    close = tuple(engine.tokenizer.encode("\n", add_special_tokens=False))
    compiled = compile_(engine, Constraint("choice", ["yes", "no"]))
    rec = Recording(compiled, ReasoningGate(close, inside=True))
    req = request(engine, "think", "Write two short lines of text.", rec, max_tokens=24)
    tokens, reason = asyncio.run(_tokens(engine, req))
    text = engine.tokenizer.decode(tokens)
    if "\n" in text:  # closed: the rest is the constrained answer
        assert reason is FinishReason.STOP
        answer = text.split("\n", 1)[1]
        assert answer in ("yes", "no"), text
    # Never closed: all of it was free text (the model may end it, or max_tokens).


def test_reasoning_gate_steps_through_open_free_and_constrained(engine: Engine) -> None:
    compiled = compile_(engine, Constraint("choice", ["yes", "no"]))
    open_token, close_token, other = 100, 200, 300
    process = compiled.make_processor(ReasoningGate((close_token,), open_token=open_token))
    logits = mx.zeros((1, compiled.vocab_size))

    def allowed(last: int) -> set[int]:
        out = process(mx.array([1, 2, last]), logits)
        return {i for i, ok in enumerate(mx.isfinite(out[0]).tolist()) if ok}

    first = allowed(1)  # the answer's first token, or the reasoning's opening
    answer_starts = first - {open_token}
    assert open_token in first and answer_starts and len(first) < 100
    assert len(allowed(open_token)) == compiled.vocab_size  # thinking: free
    assert len(allowed(other)) == compiled.vocab_size
    assert allowed(close_token) == answer_starts  # closed: the answer is constrained
    *_, last = [allowed(t) for t in engine.tokenizer.encode("yes", add_special_tokens=False)]
    assert last and last <= engine.eos_token_ids  # "yes" is complete: only the end is left


def test_compiled_grammars_are_cached_by_content(engine: Engine) -> None:
    first = compile_(engine, Constraint("json_schema", {"type": "object", "x-k": 1}))
    again = compile_(engine, Constraint("json_schema", {"x-k": 1, "type": "object"}))
    assert first is again


def test_the_compiled_grammar_cache_is_bounded(engine: Engine) -> None:
    hf_tokenizer = engine.tokenizer._tokenizer
    compiler = ConstraintCompiler(hf_tokenizer, sorted(engine.eos_token_ids), cache_entries=2)
    a, b, c = (Constraint("regex", pattern) for pattern in ("a+", "b+", "c+"))
    first, second = compiler.compile(a), compiler.compile(b)
    assert compiler.compile(a) is first  # a is now the most recent
    compiler.compile(c)  # evicts b, the least recently used
    assert compiler.cached == 2
    assert compiler.compile(a) is first
    assert compiler.compile(b) is not second  # compiled again


def test_bad_constraints_raise_with_the_location(engine: Engine) -> None:
    with pytest.raises(ConstraintError, match=r"#/properties/d/format.*bogus"):
        compile_(
            engine,
            Constraint("json_schema", {"properties": {"d": {"type": "string", "format": "bogus"}}}),
        )
    with pytest.raises(ConstraintError, match="position 2: unclosed group"):
        compile_(engine, Constraint("regex", "ab(c"))
    with pytest.raises(ConstraintError, match="unknown name"):
        compile_(engine, Constraint("grammar", "start: foo\n"))
