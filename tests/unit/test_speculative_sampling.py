"""Speculative decoding for sampled rows (engine/speculative/draws.py) on a tiny random
llama through the lean batch generator: the emitted tokens follow the distribution of
decoding without speculation (a chi-square test), and a seeded row draws exactly the
tokens decoding draws, whatever its sampling parameters and logits processors."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models import base, llama
from mlx_lm.models.cache import make_prompt_cache
from scipy.stats import chi2

from vllm_mlx.engine.batch_generator import LeanBatchGenerator
from vllm_mlx.engine.cache.rows import row_caches
from vllm_mlx.engine.sampling import Fault, GuardedSampler, SeededSampler
from vllm_mlx.engine.slot_setup import slot_processors, slot_sampler
from vllm_mlx.engine.speculative.config import SpeculativeConfig
from vllm_mlx.engine.speculative.verify import Speculator, eligible
from vllm_mlx.engine.types import GenerationRequest, SamplingParams

VOCAB = 97
# Every token occurs in the prompt, so lookup (n from 1) proposes at every step; the runs
# of one token at the end are what this random model tends to continue, so proposals
# are accepted often, though far from always (several positions deep).
_ORDER = list(range(VOCAB))
random.Random(1).shuffle(_ORDER)
PROMPT = [*_ORDER, *[40] * 4, *[41] * 4, *[42] * 4, *[40] * 4, *[41] * 3]
# Speculate at every chance (no cost model), with up to 4 proposed tokens.
SPEC = SpeculativeConfig(num_tokens=4, ngram_min=1, ngram_max=3, position_cost=0.0)
# Sampled, with every filter and a strong history-dependent penalty (over the last 4
# tokens, so the drafted tokens before a position change its distribution).
SAMPLED = SamplingParams(
    temperature=1.0,
    top_k=50,
    top_p=0.97,
    min_p=0.01,
    frequency_penalty=1.5,
    penalty_window=4,
    logit_bias={40: 6.0, 41: 3.0, 42: 6.2, 43: 2.0},
)
ROWS = 16  # per batch: each verify pass may check 4 tokens a row (128 positions)


def tiny_llama() -> llama.Model:
    args = llama.ModelArgs(
        model_type="llama", hidden_size=64, num_hidden_layers=2, intermediate_size=96,
        num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=VOCAB,
    )  # fmt: skip
    mx.random.seed(11)
    model = llama.Model(args)
    mx.eval(model.parameters())
    return model


MODEL = tiny_llama()


@pytest.fixture(autouse=True)
def mlx_attention(monkeypatch: pytest.MonkeyPatch) -> None:
    """mlx-lm's own attention for the tiny llama, whatever an earlier test's model load
    swapped in (models/cpu/attention.py swaps it module-wide for llama). That kernel's
    sums depend on a row's absolute positions, so a row a rewind moved differs from
    decoding in the last bits (docs/speculative.md); tests/engine cover the kernel."""
    monkeypatch.setattr(llama, "scaled_dot_product_attention", base.scaled_dot_product_attention)


@dataclass
class Counters:
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    speculative_steps: int = 0
    drafts: int = 0
    accepted_per_position: list[int] = field(default_factory=list)


@dataclass
class Run:
    tokens: list[list[int]]
    logprobs: list[list[np.ndarray[Any, Any]]]
    counters: Counters
    faults: list[str | None] = field(default_factory=list)


class DraftDrawFails(SeededSampler):
    """A seeded sampler whose decode steps work and whose draws at a verify pass's
    later positions (`draw`, called directly) raise."""

    def __call__(self, logprobs: mx.array) -> mx.array:
        self.key, step_key = mx.random.split(self.key)
        return SeededSampler.draw(self, logprobs, step_key)

    def draw(self, logprobs: mx.array, key: mx.array) -> mx.array:
        raise RuntimeError("boom")


def fail_drafts(sampler: GuardedSampler) -> None:
    failing = DraftDrawFails.__new__(DraftDrawFails)
    failing.__dict__.update(vars(sampler.sampler))
    sampler.sampler = failing


def generate(
    params: list[SamplingParams],
    speculate: bool,
    max_tokens: int = 8,
    logprobs: bool = False,
    failing: int | None = None,
) -> Run:
    """One sequence per entry of `params`, ROWS to a batch, as the scheduler sets rows
    up (its samplers and processors), with or without a speculator."""
    counters = Counters()
    run = Run([], [], counters)
    for start in range(0, len(params), ROWS):
        speculator = Speculator(SPEC, counters) if speculate else None
        generator = LeanBatchGenerator(
            MODEL, speculator=speculator, completion_batch_size=ROWS, prefill_batch_size=ROWS
        )
        requests = [
            GenerationRequest(str(i), PROMPT, max_tokens, p, logprobs=2 if logprobs else None)
            for i, p in enumerate(params[start : start + ROWS])
        ]
        faults = [Fault() for _ in requests]
        samplers = [slot_sampler(r, f, VOCAB, None) for r, f in zip(requests, faults, strict=True)]
        processors = [slot_processors(r, f) for r, f in zip(requests, faults, strict=True)]
        if failing is not None and start == 0:
            fail_drafts(samplers[failing])
        uids = generator.insert(
            [PROMPT] * len(requests),
            max_tokens=[max_tokens] * len(requests),
            caches=[row_caches(make_prompt_cache(MODEL)) for _ in requests],
            samplers=samplers,
            logits_processors=processors,
        )
        if speculator is not None:
            for uid, *row in zip(uids, requests, samplers, processors, strict=True):
                assert eligible(*row)
                speculator.add(uid)
        tokens: dict[int, list[int]] = {uid: [] for uid in uids}
        vectors: dict[int, list[np.ndarray[Any, Any]]] = {uid: [] for uid in uids}
        while any(len(t) < max_tokens for t in tokens.values()):
            for response in generator.next()[1]:
                tokens[response.uid].append(response.token)
                if logprobs:
                    vectors[response.uid].append(np.array(response.logprobs))
        run.faults += [f.message for f in faults]
        run.tokens += [tokens[uid] for uid in uids]
        run.logprobs += [vectors[uid] for uid in uids]
    return run


def seeded(params: SamplingParams, seeds: range) -> list[SamplingParams]:
    return [replace(params, seed=s) for s in seeds]


def homogeneity(first: list[tuple[int, ...]], second: list[tuple[int, ...]]) -> tuple[float, int]:
    """Pearson's chi-square statistic that two samples come from one distribution, and
    its degrees of freedom; categories expected fewer than 5 times are pooled."""
    a, b = Counter(first), Counter(second)
    n_a, n_b = len(first), len(second)
    table, pooled = [], [0, 0]
    for category in a.keys() | b.keys():
        total = a[category] + b[category]
        if min(total * n_a, total * n_b) / (n_a + n_b) < 5:
            pooled[0] += a[category]
            pooled[1] += b[category]
        else:
            table.append((a[category], b[category]))
    if sum(pooled):
        table.append((pooled[0], pooled[1]))
    counts = np.array(table, dtype=np.float64)
    expected = counts.sum(axis=1, keepdims=True) * np.array([n_a, n_b]) / (n_a + n_b)
    return float(((counts - expected) ** 2 / expected).sum()), len(table) - 1


def test_sampled_tokens_follow_the_distribution_of_decoding() -> None:
    # Independent seeds on each side: this checks the rule, not the shared random stream.
    samples = 800  # 1,200 cost ~10 s more of CI on a 2-core CPU
    plain = generate(seeded(SAMPLED, range(samples)), speculate=False)
    spec = generate(seeded(SAMPLED, range(10**6, 10**6 + samples)), speculate=True)
    # Not vacuous: drafts were accepted at several depths, and rejected often too.
    counters = spec.counters
    assert counters.accepted_per_position[2] > 50, counters
    assert 0.2 < counters.accepted_tokens / counters.drafted_tokens < 0.8, counters
    # Tokens 1-4 of each sequence (token 0 comes from the prompt's pass) are drawn in
    # verify passes, at every position of the pass, after accepted and rejected drafts.
    statistic, freedom = homogeneity(
        [tuple(t[1:5]) for t in plain.tokens], [tuple(t[1:5]) for t in spec.tokens]
    )
    assert freedom >= 10
    # False-failure rate 1e-3 (the samples are seeded: a pass or fail is reproducible).
    assert statistic < chi2.ppf(1 - 1e-3, freedom), (statistic, freedom)


def test_a_seeded_row_draws_what_decoding_draws() -> None:
    """The same seed gives the same tokens with and without speculation (and again),
    for sampled and greedy rows with and without filters and logits processors."""
    kinds = [
        SAMPLED,
        SamplingParams(temperature=0.7, top_p=0.9),
        SamplingParams(temperature=1.3, min_p=0.05, repetition_penalty=1.3),
        SamplingParams(temperature=0.9, top_k=5, presence_penalty=0.8, logit_bias={42: 4.0}),
        SamplingParams(frequency_penalty=0.6, penalty_window=3, logit_bias={41: 5.0}),  # greedy
    ]
    params = [p for kind in kinds for p in seeded(kind, range(12))]
    plain = generate(params, speculate=False, max_tokens=12)
    spec = generate(params, speculate=True, max_tokens=12)
    again = generate(params, speculate=True, max_tokens=12)
    assert spec.tokens == plain.tokens
    assert again.tokens == spec.tokens
    assert spec.counters.accepted_tokens > 100 and spec.counters.accepted_per_position[1] > 0


def test_logprobs_are_those_of_decoding() -> None:
    params = seeded(SAMPLED, range(8)) + seeded(SamplingParams(repetition_penalty=1.2), range(8))
    plain = generate(params, speculate=False, logprobs=True)
    spec = generate(params, speculate=True, logprobs=True)
    assert spec.tokens == plain.tokens and spec.counters.accepted_tokens > 0
    for want, have in zip(plain.logprobs, spec.logprobs, strict=True):
        assert all(np.array_equal(w, h) for w, h in zip(want, have, strict=True))


def test_a_failing_draw_fails_its_row_alone() -> None:
    """A sampler that raises at a verify pass's later position records its own
    request's fault (the scheduler then fails that request); the other rows draw what
    they draw without it."""
    params = seeded(SAMPLED, range(6))
    plain = generate(params, speculate=False)
    spec = generate(params, speculate=True, failing=2)  # row 2 accepts a draft early
    assert spec.faults[2] == "speculative sampling failed: RuntimeError: boom"
    assert spec.faults[:2] + spec.faults[3:] == [None] * 5 and plain.faults == [None] * 6
    assert spec.tokens[:2] + spec.tokens[3:] == plain.tokens[:2] + plain.tokens[3:]
