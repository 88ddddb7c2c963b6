"""Prompt-lookup speculative decoding through the real engine: greedy output is token for
token the output without it, alone and in a batch; stops, max_tokens and the prefix cache
behave as without it; rows that do not speculate keep their path; off by default."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from typing import Any

import mlx.core as mx
import pytest

from tests.support.speculative import PROMPTS, chat, greedy, in_groups
from tests.support.speculative import reference as reference_outputs
from vllm_mlx.config.model import ModelSettings
from vllm_mlx.config.speculative import SpeculativeSettings
from vllm_mlx.engine.cache.rows import BatchKVCache, KVQuantization
from vllm_mlx.engine.engine import Engine
from vllm_mlx.engine.fleet.registry import start_engine
from vllm_mlx.engine.output import generate_text
from vllm_mlx.engine.scheduler import SchedulerConfig
from vllm_mlx.engine.speculative import verify
from vllm_mlx.engine.speculative.config import SpeculativeConfig
from vllm_mlx.engine.speculative.rewind import rewind
from vllm_mlx.engine.types import Finished, GenerationRequest, SamplingParams, TextDelta
from vllm_mlx.models.cpu import attention, qmm

# position_cost 0: every proposal is checked, in batches too (the default plan skips
# passes it expects to cost more than they save), so every rewind path runs.
SPEC = SpeculativeConfig(num_tokens=4, ngram_min=2, ngram_max=4, position_cost=0.0)


@pytest.fixture(scope="module")
def speculative(engine: Engine) -> Iterator[Engine]:
    fresh = Engine(engine.loaded, SchedulerConfig(max_batch_size=16, speculative=SPEC))
    fresh.start()
    yield fresh
    fresh.stop()


@pytest.fixture(scope="module")
def reference(engine: Engine) -> list[Any]:
    """Every prompt decoded without speculation (tests/support/speculative.py)."""
    return reference_outputs(engine)


# Alone and in a full batch: a batch of 4 added 40-50 s of CI on a 2-core Xeon and no
# path that 16 rows do not take (uneven rewinds, rows moved right). Alone, every other
# prompt (each of the five kinds, three or four times): one at a time is the slow way.
@pytest.mark.parametrize("batch", [1, 16])
def test_greedy_output_is_identical_alone_and_in_a_batch(
    speculative: Engine, reference: list[Any], batch: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    uneven: list[Sequence[int]] = []  # passes whose rows kept different numbers

    def watched(layers: Any, written: int, keep: Sequence[int]) -> None:
        if len(set(keep)) > 1:
            uneven.append(keep)
        rewind(layers, written, keep)

    monkeypatch.setattr(verify, "rewind", watched)
    stats = speculative.scheduler.stats
    drafted, accepted = stats.drafted_tokens, stats.accepted_tokens
    drafts, by_position = stats.drafts, list(stats.accepted_per_position)
    every = 1 if batch > 1 else 2
    got = in_groups(speculative, greedy(speculative, PROMPTS[::every]), batch)
    for text, want, have in zip(PROMPTS[::every], reference[::every], got, strict=True):
        assert have[:2] == want[:2], text
    # Not vacuous: proposals were made and many of them were right.
    made, right = stats.drafted_tokens - drafted, stats.accepted_tokens - accepted
    assert made > 40 and right > 0.25 * made, (made, right)
    assert bool(uneven) == (batch > 1)  # in a batch, rows were moved right (rewind.py)
    assert stats.speculative_steps > 0
    # The metrics' counters agree: each accepted token has a position, position k is
    # accepted only after k - 1 was, and a pass checks at most one proposal per row.
    per_position = [
        now - (by_position[k] if k < len(by_position) else 0)
        for k, now in enumerate(stats.accepted_per_position)
    ]
    assert sum(per_position) == right
    assert per_position == sorted(per_position, reverse=True) and len(per_position) <= 4
    assert 0 < stats.drafts - drafts <= batch * stats.speculative_steps


def test_status_shows_each_speculating_requests_acceptance(speculative: Engine) -> None:
    scheduler = speculative.scheduler
    seen: list[list[dict[str, Any]]] = []
    scheduler.on_step = lambda _prompt, _generated: seen.append(scheduler.snapshot())
    try:
        (request,) = greedy(speculative, PROMPTS[:1], max_tokens=40)
        hot = SamplingParams(temperature=1.0, seed=3)
        opted_out = GenerationRequest("s", request.prompt_tokens, 8, hot, speculative=False)
        in_groups(speculative, [request, opted_out], 2)
    finally:
        scheduler.on_step = None
    rows = [row for snapshot in seen for row in snapshot if row["phase"] == "generation"]
    greedy_rows = [r["speculative"] for r in rows if r["request_id"] == request.request_id]
    assert greedy_rows and greedy_rows[-1]["drafted_tokens"] > 0
    last = greedy_rows[-1]
    assert 0 < last["accepted_tokens"] <= last["drafted_tokens"]
    assert last["acceptance_rate"] == round(last["accepted_tokens"] / last["drafted_tokens"], 4)
    # A request that opted out does not speculate, and says nothing about it.
    assert all("speculative" not in r for r in rows if r["request_id"] == "s")


async def text_of(engine: Engine, request: GenerationRequest) -> tuple[str, Finished]:
    parts: list[str] = []
    async for event in generate_text(engine, request):
        if isinstance(event, TextDelta):
            parts.append(event.text)
        else:
            return "".join(parts), event
    raise AssertionError("no Finished")


@pytest.mark.parametrize(
    ("max_tokens", "stop"),
    [(1, ()), (24, ("are blue",)), (24, ("9",))],
)
def test_stops_and_max_tokens_end_where_they_would(
    engine: Engine, speculative: Engine, max_tokens: int, stop: tuple[str, ...]
) -> None:
    def requests(target: Engine) -> list[GenerationRequest]:
        return [
            GenerationRequest(f"s{i}", chat(target, t), max_tokens, SamplingParams(), stop)
            for i, t in enumerate(PROMPTS[:3])
        ]

    async def both(target: Engine) -> list[tuple[str, Finished]]:
        return list(await asyncio.gather(*(text_of(target, r) for r in requests(target))))

    want, have = asyncio.run(both(engine)), asyncio.run(both(speculative))
    for (w_text, w_end), (h_text, h_end) in zip(want, have, strict=True):
        assert h_text == w_text
        assert (h_end.reason, h_end.stop_sequence, h_end.usage) == (
            w_end.reason,
            w_end.stop_sequence,
            w_end.usage,
        )


def test_the_prefix_cache_holds_only_accepted_kv(engine: Engine) -> None:
    def started(spec: SpeculativeConfig | None) -> Engine:
        config = SchedulerConfig(max_batch_size=8, prefix_cache_bytes=64 * 2**20, speculative=spec)
        fresh = Engine(engine.loaded, config)
        fresh.start()
        return fresh

    plain, spec = started(None), started(SPEC)
    try:
        prompt = chat(engine, PROMPTS[0])
        request = GenerationRequest("p", prompt, 40, SamplingParams())
        (want,) = in_groups(plain, [request], 1)
        (have,) = in_groups(spec, [request], 1)
        assert have == want and spec.scheduler.stats.accepted_tokens > 0
        sequence = [*prompt, *want[0], 0]  # one token past the stored sequence

        def held(target: Engine) -> tuple[int, list[mx.array]]:
            def read() -> tuple[int, list[mx.array]]:
                hit = target.scheduler.prefix_cache.lookup(sequence)
                assert hit.cache is not None
                arrays = [a[..., : c.offset, :] for c in hit.cache for a in (c.keys, c.values)]
                mx.eval(arrays)
                return hit.cached, arrays

            result: tuple[int, list[mx.array]] = target.scheduler.call(read).result(30)
            return result

        (n_plain, kv_plain), (n_spec, kv_spec) = held(plain), held(spec)
        assert n_spec == n_plain == len(sequence) - 1
        assert all(mx.array_equal(a, b).item() for a, b in zip(kv_plain, kv_spec, strict=True))
    finally:
        plain.stop()
        spec.stop()


def test_rows_that_do_not_speculate_keep_their_output(engine: Engine, speculative: Engine) -> None:
    def mixed(target: Engine) -> list[GenerationRequest]:
        prompt = chat(target, PROMPTS[0])
        hot = SamplingParams(temperature=0.8, seed=5)
        return [
            GenerationRequest("greedy", prompt, 20, SamplingParams()),
            GenerationRequest("sampled", prompt, 20, hot, speculative=False),
            GenerationRequest(
                "logprobs", prompt, 20, SamplingParams(), logprobs=2, speculative=False
            ),
            GenerationRequest("penalty", prompt, 20, SamplingParams(repetition_penalty=1.3)),
        ]

    want = in_groups(engine, mixed(engine), 4)
    before = speculative.scheduler.stats.drafted_tokens
    have = in_groups(speculative, mixed(speculative), 4)
    assert [h[:2] for h in have] == [w[:2] for w in want]
    assert speculative.scheduler.stats.drafted_tokens > before  # the greedy rows drafted


def test_off_unless_configured(engine: Engine, reference: list[Any]) -> None:
    assert reference and engine.scheduler.stats.drafted_tokens == 0
    assert engine.scheduler.stats.speculative_steps == 0


def test_a_models_section_turns_it_on(engine: Engine, reference: list[Any]) -> None:
    section = SpeculativeSettings(method="ngram", num_tokens=3)
    settings = ModelSettings(
        name="smol", source="builtin:smollm2-135m-instruct", speculative=section
    )
    started, _ = start_engine(engine.loaded, SchedulerConfig(max_batch_size=8), settings)
    assert started is not None
    try:
        (got,) = in_groups(started, greedy(started, PROMPTS[:1], 40), 1)
        (want,) = in_groups(engine, greedy(engine, PROMPTS[:1], 40), 1)
        assert got == want
        assert started.scheduler.stats.drafted_tokens > 0
    finally:
        started.stop()


def test_rewind_keeps_each_rows_run_and_moves_the_shorter_right() -> None:
    # Two rows, one padded; a pass wrote 3 positions; row 0 keeps 3, row 1 keeps 1.
    cache = BatchKVCache([1, 0])
    cache.update_and_fetch(*([mx.arange(8, dtype=mx.float32).reshape(2, 1, 4, 1)] * 2))
    stored: Any = cache.keys
    before = stored[..., :4, :]
    cache.update_and_fetch(*([mx.full((2, 1, 3, 1), 100.0)] * 2))
    rewind([cache], written=3, keep=[3, 1])
    assert cache._idx == 7
    assert cache.left_padding.tolist() == [1, 2] and cache.offset.tolist() == [6, 5]
    stored = cache.keys
    keys = stored[..., :7, 0]
    assert keys[0, 0, 1:].tolist() == [1.0, 2.0, 3.0, 100.0, 100.0, 100.0]
    # Row 1: its 4 old positions and its one kept new one, now ending at the index.
    assert keys[1, 0, 2:].tolist() == [*before[1, 0, :, 0].tolist(), 100.0]


def test_a_quantized_rows_run_moves_with_its_scales_and_biases() -> None:
    """A quantized batch cache (kv_cache.bits): words, scales and biases move alike."""
    cache = BatchKVCache([1, 0], quant=KVQuantization(8, 32, 0))
    old = mx.random.normal((2, 1, 4, 32), key=mx.random.key(1))
    cache.update_and_fetch(old, old)
    assert cache.quantized
    new = mx.random.normal((2, 1, 3, 32), key=mx.random.key(2))
    cache.update_and_fetch(new, new)
    before = [part[..., :7, :] for part in cache.keys]  # type: ignore[union-attr]
    mx.eval(before)
    rewind([cache], written=3, keep=[3, 1])
    assert cache.left_padding.tolist() == [1, 2] and cache.offset.tolist() == [6, 5]
    for was, now in zip(before, cache.keys, strict=True):  # type: ignore[arg-type]
        assert mx.array_equal(now[0, :, :7], was[0])  # row 0 kept all: unmoved
        # Row 1: its 4 old positions and its first new one, now ending at the index.
        assert mx.array_equal(now[1, :, 2:7], was[1, :, :5])


def test_a_quantized_kv_cache_speculates_with_the_same_output(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kv_cache.bits with speculation: a batch of 8 gives the tokens the same quantized
    cache gives without it; rows were moved right (the quantized rewind), and the verify
    passes read the quantized cache in one call per layer (models/cpu/attention.py)."""
    uneven: list[Sequence[int]] = []

    def watched(layers: Any, written: int, keep: Sequence[int]) -> None:
        if len(set(keep)) > 1:
            uneven.append(keep)
        rewind(layers, written, keep)

    monkeypatch.setattr(verify, "rewind", watched)
    ext = qmm.extension()
    widths: set[int] = set()
    quantized_attention = ext.sdpa_decode_quantized

    def counted(q: mx.array, *args: Any, **kw: Any) -> mx.array:
        widths.add(q.shape[2])
        return quantized_attention(q, *args, **kw)  # type: ignore[no-any-return]

    monkeypatch.setattr(ext, "sdpa_decode_quantized", counted)
    kv = KVQuantization(8, 32, 0)
    plain = Engine(engine.loaded, SchedulerConfig(max_batch_size=8, kv_quantization=kv))
    spec = Engine(
        engine.loaded, SchedulerConfig(max_batch_size=8, speculative=SPEC, kv_quantization=kv)
    )
    texts = PROMPTS[:8]
    for started in (plain, spec):
        started.start()
    try:
        want = in_groups(plain, greedy(plain, texts), 8)
        got = in_groups(spec, greedy(spec, texts), 8)
    finally:
        plain.stop()
        spec.stop()
    for text, expected, have in zip(texts, want, got, strict=True):
        assert have[:2] == expected[:2], text
    assert spec.scheduler.stats.accepted_tokens > 10 and uneven  # measured: 20 of 41
    assert max(widths) > attention.SHORT_CHUNK_QUERIES  # a verify pass's positions at once
