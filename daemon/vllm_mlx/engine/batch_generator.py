"""mlx-lm's BatchGenerator with a decode step that normalizes logits only when asked.

mlx-lm's `GenerationBatch._step` turns every row's logits into log-probabilities
(`logits - logsumexp`) and evaluates them each step, whether or not anything reads them.
On Linux MLX's CPU `exp` is scalar, so for a 49k-token vocabulary at 16 rows that was
~7 ms of a ~100 ms step (docs/benchmarks.md). The normalization that remains goes through
`log_probabilities` (models/cpu/vocab.py: the extension's logsumexp, the same bits). Here:

- greedy rows (the shared `greedy_sampler`) take the argmax of the logits themselves:
  the same token as the argmax of the log-probabilities, which differ by a constant per
  row (only a rounding tie between two top logits could pick the other one);
- other samplers get their own row's log-probabilities, computed for that row alone
  (one sampler shared by the whole batch, like a distributed group's, gets the batch's);
- the batch's log-probabilities stay lazy: the scheduler evaluates them only for the
  requests that asked for logprobs (engine/logprobs.py), and nothing else pays.

Each row's token and log-probabilities depend on that row's logits alone, so a sequence
gets the same bits alone or in a batch. Prompt processing, continuous batching, caches
and stop conditions are mlx-lm's own, unchanged.

With a `speculator` (a model's `speculative` section), a step where opted-in rows have
prompt-lookup proposals is a verify step instead (engine/speculative/verify.py); any
other step is the one above. With a `pacer`, each step's prefill chunk is sized by time
while sequences decode (engine/prefill_pacing.py).
"""

from __future__ import annotations

import time
from typing import Any

import mlx.core as mx
from mlx_lm.generate import BatchGenerator, GenerationBatch
from mlx_lm.sample_utils import greedy_sampler

from vllm_mlx.engine.prefill_pacing import PrefillPacer
from vllm_mlx.engine.scheduler_state import SchedulerConfig
from vllm_mlx.engine.speculative.verify import Speculator
from vllm_mlx.models.cpu.vocab import log_probabilities


class LeanGenerationBatch(GenerationBatch):
    speculator: Speculator | None = None
    # Set by a paced generator for a step that a prompt's chunk follows: the step's
    # computation is finished before `next` returns (not left running under the chunk's),
    # and `step_seconds` is what it took, so that the pacer knows both costs apart.
    settle: bool = False
    step_seconds: float | None = None

    def next(self) -> list[Any]:
        started = time.perf_counter()
        responses = self._responses()
        if self.settle and self.uids and self._next_tokens is not None:
            mx.eval(self._next_tokens)
        self.step_seconds = time.perf_counter() - started if self.settle else None
        return responses

    def _responses(self) -> list[Any]:
        if self.speculator is not None and self.uids:
            responses = self.speculator.step(self)
            if responses is not None:
                return responses
        return super().next()  # type: ignore[no-any-return]

    def _step(self) -> tuple[list[int], list[mx.array]]:
        inputs: mx.array = self._next_tokens  # type: ignore[assignment]
        self._current_tokens = inputs  # type: ignore[assignment]
        self._current_logprobs = self._next_logprobs
        logits = self.model(inputs[:, None], cache=self.prompt_cache)[:, -1, :]
        logits, token_context = self._process(inputs, logits)
        # Lazy: evaluated only when a request's logprobs are read.
        logprobs = log_probabilities(logits)
        self._next_tokens = self._sample(logits, logprobs)
        self._next_logprobs = list(logprobs)
        # Start computing the next step, then wait for this one's tokens (mlx-lm's
        # pipelining: the graph of step n+1 is built while step n computes).
        mx.async_eval(self._next_tokens, token_context)
        mx.eval(inputs)
        tokens: list[int] = inputs.tolist()  # type: ignore[assignment]
        for record, token in zip(self.tokens, tokens, strict=True):
            record.append(token)
        return tokens, self._current_logprobs

    def _process(self, inputs: mx.array, logits: mx.array) -> tuple[mx.array, list[mx.array]]:
        """Each row's logits processors, with that row's token history."""
        per_row = self.logits_processors or []
        if not any(per_row):
            return logits, []
        rows, contexts = [], []
        for e, processors in enumerate(per_row):
            row = logits[e : e + 1]
            if processors:  # only rows with processors keep a history
                context = self._token_context[e].update_and_fetch(inputs[e : e + 1])
                contexts.append(context)
                for processor in processors:
                    row = processor(context, row)
            rows.append(row)
        return mx.concatenate(rows, axis=0), contexts

    def _sample(self, logits: mx.array, logprobs: mx.array) -> mx.array:
        samplers = [self.fallback_sampler if s is None else s for s in self.samplers or ()]
        samplers = samplers or [self.fallback_sampler] * len(self.uids)
        first = samplers[0]
        if all(s is first for s in samplers):  # one batched call, as mlx-lm makes it
            return mx.argmax(logits, axis=-1) if first is greedy_sampler else first(logprobs)
        picked = []
        for e, sampler in enumerate(samplers):
            row = logits[e : e + 1]
            if sampler is greedy_sampler:
                picked.append(mx.argmax(row, axis=-1))
            else:
                picked.append(sampler(log_probabilities(row)))
        return mx.concatenate(picked, axis=0)


class LeanBatchGenerator(BatchGenerator):
    """BatchGenerator whose decode batch is a LeanGenerationBatch (new sequences take
    mlx-lm's first step, then join it through `extend`)."""

    def __init__(
        self,
        model: Any,
        speculator: Speculator | None = None,
        pacer: PrefillPacer | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, **kwargs)
        self._generation_batch = LeanGenerationBatch.empty(self.model, self.sampler)
        self._generation_batch.speculator = speculator
        self.speculator = speculator
        self.pacer = pacer

    def _next(self) -> tuple[list[Any], list[Any]]:
        pacer = self.pacer
        if pacer is None:
            return super()._next()  # type: ignore[no-untyped-call,no-any-return]
        decoding = len(self._generation_batch) > 0
        prompts = len(self._prompt_batch) + len(self._unprocessed_sequences)
        chunk = pacer.chunk(decoding, min(prompts, self.prefill_batch_size))
        # mlx-lm cuts each prompt's next piece by the generator's size, and the prompt
        # batch loops over that piece by its own: both follow the pacer.
        self.prefill_step_size = chunk
        self._prompt_batch.prefill_step_size = chunk
        batch = self._generation_batch
        batch.settle = decoding and prompts > 0
        before = self._counters.prompt_tokens
        started = time.perf_counter()
        prompt_responses, generation_responses = super()._next()  # type: ignore[no-untyped-call]
        seconds = time.perf_counter() - started
        processed = self._counters.prompt_tokens - before
        decode_seconds = batch.step_seconds  # None unless settled
        if decode_seconds is None and not processed:
            decode_seconds = seconds  # a step with no chunk: all of it
        pacer.observe(seconds, processed, decode_seconds if generation_responses else None)
        return prompt_responses, generation_responses


def make_generator(
    model: Any,
    config: SchedulerConfig,
    eos: set[int],
    speculator: Speculator | None,
    paced: bool,
) -> LeanBatchGenerator:
    """The scheduler's generator for `config`; `paced`: size prefill chunks by time while
    sequences decode (when the config asks for it)."""
    stall = config.max_prefill_stall
    pacer = PrefillPacer(config.prefill_step_size, stall) if paced and stall is not None else None
    return LeanBatchGenerator(
        model,
        speculator=speculator,
        pacer=pacer,
        stop_tokens=[[t] for t in sorted(eos)],
        completion_batch_size=config.max_batch_size,
        prefill_batch_size=min(config.prefill_batch_size, config.max_batch_size),
        prefill_step_size=config.prefill_step_size,
    )
