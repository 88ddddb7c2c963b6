"""Prompt lookup for sampled rows and rows asking for logprobs, through the real engine:
a seeded request draws the same tokens as without speculation (alone, in a batch, and
again), logprobs are decoding's, and a batch mixing every kind of row keeps each row's
output. The distribution test is tests/unit/test_speculative_sampling.py."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pytest

from tests.support.speculative import in_groups as groups_of
from vllm_mlx.engine.constraints import Constraint
from vllm_mlx.engine.engine import Engine
from vllm_mlx.engine.scheduler import SchedulerConfig
from vllm_mlx.engine.speculative.config import SpeculativeConfig
from vllm_mlx.engine.types import (
    GenerationRequest,
    SamplingParams,
    SequenceFinished,
    TokenLogprob,
    TokensGenerated,
)

# position_cost 0: every proposal is checked, in batches too.
SPEC = SpeculativeConfig(num_tokens=4, ngram_min=2, ngram_max=4, position_cost=0.0)
CODE = "def area(w, h):\n    return w * h\n\ndef total(items):\n    return sum(items)\n"
PROMPTS = [
    "Repeat this text exactly: the apples are red, the apples are blue, the apples are here.",
    "Copy this code and rename area to field_area:\n" + CODE,
    "Write the list 'rivers 1, rivers 2, rivers 3' and continue it to rivers 9.",
    "Quote this line three times: I like violins and violins like me.",
]
# Sampled kinds: filters, penalties (the history includes drafted tokens), logit_bias.
KINDS = [
    SamplingParams(temperature=0.7, top_p=0.9),
    SamplingParams(temperature=1.0, top_k=20, min_p=0.05),
    SamplingParams(temperature=0.6, repetition_penalty=1.1, logit_bias={13: 1.5}),
    SamplingParams(temperature=0.8, presence_penalty=0.3, frequency_penalty=0.2),
]


@dataclass
class Output:
    tokens: list[int]
    logprobs: list[TokenLogprob]
    reason: str


def chat(engine: Engine, text: str) -> list[int]:
    messages = [{"role": "user", "content": text}]
    return list(engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True))


async def output_of(engine: Engine, request: GenerationRequest) -> Output:
    out = Output([], [], "")
    async for event in engine.events(request):
        if isinstance(event, TokensGenerated):
            out.tokens.extend(event.tokens)
            out.logprobs.extend(event.logprobs)
        elif isinstance(event, SequenceFinished):
            out.reason = event.reason.value
            return out
    raise AssertionError("no SequenceFinished")


def in_groups(engine: Engine, requests: Sequence[GenerationRequest], size: int) -> list[Output]:
    return groups_of(engine, requests, size, output_of)


def sampled(engine: Engine, max_tokens: int = 24) -> list[GenerationRequest]:
    """Each prompt under each kind, with its own seed."""
    return [
        GenerationRequest(
            f"s{i}",
            chat(engine, PROMPTS[i % len(PROMPTS)]),
            max_tokens,
            replace(KINDS[i // len(PROMPTS)], seed=100 + i),
        )
        for i in range(len(PROMPTS) * len(KINDS))
    ]


def watched(
    engine: Engine, requests: Sequence[GenerationRequest], size: int
) -> tuple[list[Output], dict[str, int]]:
    """The outputs, and each speculating request's accepted tokens (from /v1/status's
    per-request block, read after every step)."""
    scheduler = engine.scheduler
    seen: list[list[dict[str, Any]]] = []
    scheduler.on_step = lambda _prompt, _generated: seen.append(scheduler.snapshot())
    try:
        outputs = in_groups(engine, requests, size)
    finally:
        scheduler.on_step = None
    accepted: dict[str, int] = {}
    for row in (row for snapshot in seen for row in snapshot):
        if "speculative" in row:
            accepted[row["request_id"]] = row["speculative"]["accepted_tokens"]
    return outputs, accepted


@pytest.fixture(scope="module")
def speculative(engine: Engine) -> Iterator[Engine]:
    fresh = Engine(engine.loaded, SchedulerConfig(max_batch_size=8, speculative=SPEC))
    fresh.start()
    yield fresh
    fresh.stop()


@pytest.fixture(scope="module")
def reference(engine: Engine) -> list[Output]:
    # 4 at a time: a seeded row draws the same alone or batched without speculation
    # (tests/engine/test_engine.py::test_seed_reproduces_the_same_text_whatever_shares_the_batch).
    return in_groups(engine, sampled(engine), 4)


@pytest.mark.parametrize("batch", [1, 4])
def test_a_seeded_request_draws_what_decoding_draws(
    speculative: Engine, reference: list[Output], batch: int
) -> None:
    stats = speculative.scheduler.stats
    drafted, accepted = stats.drafted_tokens, stats.accepted_tokens
    deep = list(stats.accepted_per_position)
    # Alone, every other request (each kind on two prompts): one at a time is the slow way.
    every = 2 if batch == 1 else 1
    got = in_groups(speculative, sampled(speculative)[::every], batch)
    for want, have in zip(reference[::every], got, strict=True):
        assert (have.tokens, have.reason) == (want.tokens, want.reason)
    # Not vacuous: sampled rows drafted, and drafts were accepted, some several deep.
    made, right = stats.drafted_tokens - drafted, stats.accepted_tokens - accepted
    assert made > 40 and right > 0.25 * made, (made, right)
    assert stats.accepted_per_position[1] > (deep[1] if len(deep) > 1 else 0)


def test_a_seeded_request_repeats_whatever_shares_its_batch(speculative: Engine) -> None:
    request = sampled(speculative, 32)[1]
    others = [r for r in sampled(speculative, 16) if r.request_id != request.request_id]
    (alone,) = in_groups(speculative, [request], 1)
    crowded = in_groups(speculative, [*others[:3], request], 4)[-1]
    assert crowded.tokens == alone.tokens and len(alone.tokens) > 8


def logprob_requests(engine: Engine) -> list[GenerationRequest]:
    prompt = chat(engine, PROMPTS[0])
    return [
        GenerationRequest("greedy", prompt, 24, SamplingParams(), logprobs=3),
        GenerationRequest(
            "sampled", prompt, 24, SamplingParams(temperature=0.8, seed=7), logprobs=2
        ),
        GenerationRequest(
            "raw",
            prompt,
            24,
            SamplingParams(repetition_penalty=1.05),
            logprobs=2,
            logprobs_raw=True,
        ),
        GenerationRequest(
            "chosen", prompt, 24, SamplingParams(temperature=0.5, seed=3), logprobs=0
        ),
    ]


def close(want: TokenLogprob, have: TokenLogprob, tolerance: float) -> bool:
    if (want.token, len(want.top)) != (have.token, len(have.top)):
        return False
    values = [(want.logprob, have.logprob)] + [
        (w[1], h[1]) for w, h in zip(want.top, have.top, strict=True)
    ]
    same_ids = {t for t, _ in want.top} == {t for t, _ in have.top}
    return same_ids and all(abs(w - h) <= tolerance for w, h in values)


@pytest.mark.parametrize("batch", [1, 4])
def test_logprobs_are_decodings(engine: Engine, speculative: Engine, batch: int) -> None:
    """Alone, the same floats; in a batch, a row whose positions a rewind moved
    (rewind.py) can differ in the last bits, as a change of left padding does."""
    want = in_groups(engine, logprob_requests(engine), batch)
    have, accepted = watched(speculative, logprob_requests(speculative), batch)
    for w, h in zip(want, have, strict=True):
        assert h.tokens == w.tokens
        assert len(h.logprobs) == len(h.tokens)
        if batch == 1:
            assert h.logprobs == w.logprobs  # the same floats, the same alternatives
        else:
            assert all(close(a, b, 1e-4) for a, b in zip(w.logprobs, h.logprobs, strict=True))
    # Every row took accepted drafts (the status block counts only emitted ones).
    assert set(accepted) == {"greedy", "sampled", "raw", "chosen"}
    assert min(accepted.values()) > 0, accepted


def test_a_mixed_batch_keeps_every_rows_output(engine: Engine, speculative: Engine) -> None:
    def mixed(target: Engine) -> list[GenerationRequest]:
        prompt = chat(target, PROMPTS[0])
        regex = Constraint("regex", r"(the apples are (red|blue|here), ){2,4}")
        grammar = target.constraints.compile(regex).bind(None)
        hot = SamplingParams(temperature=0.8, seed=5)
        return [
            GenerationRequest("greedy", prompt, 20, SamplingParams()),
            GenerationRequest("sampled", prompt, 20, SamplingParams(temperature=0.5, seed=3)),
            GenerationRequest("logprobs", prompt, 20, SamplingParams(), logprobs=2),
            GenerationRequest("penalty", prompt, 20, SamplingParams(repetition_penalty=1.3)),
            GenerationRequest("opted-out", prompt, 20, hot, speculative=False),
            GenerationRequest("grammar", prompt, 20, hot, constraint=grammar),
        ]

    want = in_groups(engine, mixed(engine), 6)
    have, accepted = watched(speculative, mixed(speculative), 6)
    for w, h in zip(want, have, strict=True):
        assert (h.tokens, h.reason) == (w.tokens, w.reason)
        assert all(close(a, b, 1e-4) for a, b in zip(w.logprobs, h.logprobs, strict=True))
    # The opted-out row never speculates; the others do, the grammar's row included.
    assert set(accepted) == {"greedy", "sampled", "logprobs", "penalty", "grammar"}
    assert accepted["sampled"] > 0 and accepted["logprobs"] > 0 and accepted["grammar"] > 0


def drafted_by_row(
    engine: Engine, requests: Sequence[GenerationRequest], size: int
) -> tuple[list[Output], dict[str, tuple[int, int]]]:
    """The outputs, and each speculating request's (proposed, accepted) tokens."""
    scheduler = engine.scheduler
    seen: dict[str, tuple[int, int]] = {}

    def read(_prompt: int, _generated: int) -> None:
        for row in scheduler.snapshot():
            if "speculative" in row:
                block = row["speculative"]
                seen[row["request_id"]] = (block["drafted_tokens"], block["accepted_tokens"])

    scheduler.on_step = read
    try:
        return in_groups(engine, requests, size), seen
    finally:
        scheduler.on_step = None


@pytest.mark.parametrize("batch", [1, 3])
def test_drafts_the_grammar_forbids_are_rejected_never_emitted(
    engine: Engine, speculative: Engine, batch: int
) -> None:
    """The prompt repeats "the apples are blue"; prompt lookup proposes "blue" after
    "the apples are", and the grammar allows only red or here there. The output is the
    output without speculation (greedy and seeded), with no "blue" in it, and those rows
    had proposals rejected while others were accepted."""

    def constrained(target: Engine) -> list[GenerationRequest]:
        prompt = chat(target, PROMPTS[0])
        regex = Constraint("regex", r"(the apples are (red|here), ){3,5}the end")
        schema = Constraint(
            "json_schema",
            {"type": "object", "properties": {"apples": {"enum": ["red", "here"]}},
             "required": ["apples"], "additionalProperties": False},
        )  # fmt: skip
        grammars = [target.constraints.compile(c).bind(None) for c in (regex, schema)]
        return [
            GenerationRequest("greedy", prompt, 40, SamplingParams(), constraint=grammars[0]),
            GenerationRequest(
                "sampled", prompt, 40, SamplingParams(temperature=0.7, seed=9),
                constraint=grammars[0],
            ),
            GenerationRequest("json", prompt, 24, SamplingParams(), constraint=grammars[1]),
        ]  # fmt: skip

    want = in_groups(engine, constrained(engine), batch)
    have, counts = drafted_by_row(speculative, constrained(speculative), batch)
    for w, h in zip(want, have, strict=True):
        assert (h.tokens, h.reason) == (w.tokens, w.reason)
        assert "blue" not in speculative.tokenizer.decode(h.tokens)
    for name in ("greedy", "sampled"):
        proposed, accepted = counts[name]
        assert 0 < accepted < proposed, (name, counts)
