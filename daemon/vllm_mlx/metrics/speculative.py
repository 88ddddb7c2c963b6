"""Speculative decoding counters per model (docs/speculative.md), read from each engine's
plain-int counters when Prometheus scrapes, under vLLM's names so its dashboards read
them: proposals checked, tokens proposed, tokens accepted, and accepted tokens by their
position in the proposal, labelled by model and method. Only models with a
`speculative` section are listed; a counter starts again from 0 when its model is
reloaded (a counter reset to rate())."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector


@dataclass(frozen=True)
class SpeculativeSample:
    model: str
    method: str  # ngram or draft (the model's speculative.method)
    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    accepted_per_position: tuple[int, ...] = ()


SpeculativeSource = Callable[[], list[SpeculativeSample]]

TOTALS: tuple[tuple[str, str, Callable[[SpeculativeSample], int]], ...] = (
    ("vllm:spec_decode_num_drafts", "Proposals checked by the target model (one per "
     "speculating request per verify pass).", lambda s: s.drafts),
    ("vllm:spec_decode_num_draft_tokens", "Tokens proposed.", lambda s: s.draft_tokens),
    ("vllm:spec_decode_num_accepted_tokens", "Proposed tokens accepted (emitted without a "
     "forward pass of their own).", lambda s: s.accepted_tokens),
)  # fmt: skip


class SpeculativeCollector(Collector):
    def __init__(self, source: SpeculativeSource) -> None:
        self._source = source

    def collect(self) -> Iterable[Metric]:
        samples = self._source()
        for name, doc, value in TOTALS:
            family = CounterMetricFamily(name, doc, labels=["model_name", "method"])
            for sample in samples:
                family.add_metric([sample.model, sample.method], float(value(sample)))
            yield family
        by_position = CounterMetricFamily(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Proposals whose token at this position (0: the first proposed) was accepted.",
            labels=["model_name", "method", "position"],
        )
        for sample in samples:
            for position, count in enumerate(sample.accepted_per_position):
                labels = [sample.model, sample.method, str(position)]
                by_position.add_metric(labels, float(count))
        yield by_position
