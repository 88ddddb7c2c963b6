"""The lean decode step against mlx-lm's own, on a small random llama (fast, exact)."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.generate import BatchGenerator
from mlx_lm.models import llama
from mlx_lm.sample_utils import greedy_sampler

from vllm_mlx.engine.batch_generator import LeanBatchGenerator, LeanGenerationBatch
from vllm_mlx.engine.sampling import make_sampler
from vllm_mlx.engine.types import SamplingParams

PROMPTS = [[1, 5, 9, 33], [4, 4, 8, 96, 0, 12], [7], [50, 51, 52]]
VOCAB = 97


def tiny_llama() -> llama.Model:
    args = llama.ModelArgs(
        model_type="llama", hidden_size=64, num_hidden_layers=2, intermediate_size=96,
        num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=VOCAB,
    )  # fmt: skip
    mx.random.seed(11)
    model = llama.Model(args)
    mx.eval(model.parameters())
    return model


def seeded(seed: int) -> Any:
    return make_sampler(SamplingParams(temperature=0.8, top_k=20, seed=seed), VOCAB)


def mixed(first: int, second: int) -> list[Any]:
    return [seeded(first), greedy_sampler, seeded(second), greedy_sampler]


def run(
    generator_class: type[BatchGenerator],
    prompts: list[list[int]],
    samplers: list[Any],
    steps: int = 12,
) -> tuple[list[list[int]], list[list[np.ndarray]]]:
    """Each sequence's tokens and per-step log-probabilities."""
    generator = generator_class(tiny_llama(), completion_batch_size=8, prefill_batch_size=8)
    uids = generator.insert(prompts, max_tokens=[steps] * len(prompts), samplers=samplers)
    tokens: dict[int, list[int]] = {uid: [] for uid in uids}
    logprobs: dict[int, list[np.ndarray]] = {uid: [] for uid in uids}
    while any(len(t) < steps for t in tokens.values()):
        for response in generator.next()[1]:
            tokens[response.uid].append(response.token)
            logprobs[response.uid].append(np.array(response.logprobs))
    return [tokens[u] for u in uids], [logprobs[u] for u in uids]


def test_the_generator_decodes_with_the_lean_step() -> None:
    generator = LeanBatchGenerator(tiny_llama())
    generator.insert([[1, 2, 3]], max_tokens=[3])
    generator.next()
    generator.next()
    assert type(generator._generation_batch) is LeanGenerationBatch


def test_greedy_tokens_and_logprobs_equal_mlx_lm() -> None:
    samplers = [greedy_sampler] * len(PROMPTS)
    want_tokens, want_logprobs = run(BatchGenerator, PROMPTS, samplers)
    tokens, logprobs = run(LeanBatchGenerator, PROMPTS, samplers)
    assert tokens == want_tokens
    for got_rows, want_rows in zip(logprobs, want_logprobs, strict=True):
        for got, want in zip(got_rows, want_rows, strict=True):
            assert np.array_equal(got, want)  # the lazy ones, read: the same bits


def test_a_mixed_batch_samples_each_row_as_mlx_lm_does() -> None:
    """Seeded rows get their row's log-probabilities (computed for that row alone) and
    draw the same tokens; greedy rows beside them take the argmax."""
    want, _ = run(BatchGenerator, PROMPTS, [seeded(1), greedy_sampler, seeded(2), greedy_sampler])
    got, _ = run(
        LeanBatchGenerator, PROMPTS, [seeded(1), greedy_sampler, seeded(2), greedy_sampler]
    )
    assert got == want


def test_a_row_gets_the_same_tokens_alone_and_in_a_batch() -> None:
    batch, _ = run(
        LeanBatchGenerator, PROMPTS, [seeded(3), greedy_sampler, seeded(4), greedy_sampler]
    )
    for index, sampler in ((0, seeded(3)), (1, greedy_sampler), (2, seeded(4))):
        alone, _ = run(LeanBatchGenerator, [PROMPTS[index]], [sampler])
        assert alone[0] == batch[index]
