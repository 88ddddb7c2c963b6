"""Per-key counters on /metrics: the `key` label is the key's name, never its secret.

The label sets stay bounded: keys come from the config file, models from the served
list, routes are templates ("unmatched" for any other path).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from vllm_mlx.usage.record import RequestUsage


class KeyMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ["key", "model", "route"]
        self.requests = Counter(
            "vllm_mlx_key_requests",
            "API requests answered, by key name, model and route template.",
            labels,
            registry=registry,
        )
        self.errors = Counter(
            "vllm_mlx_key_errors",
            "API requests answered with a 4xx or 5xx status, by key name, model and route.",
            labels,
            registry=registry,
        )
        self.tokens = Counter(
            "vllm_mlx_key_tokens",
            "Tokens by key name, model and kind (prompt, cached: the part of prompt the "
            "prefix cache supplied, completion).",
            ["key", "model", "kind"],
            registry=registry,
        )

    def observe(self, key: str, route: str, usage: RequestUsage, error: bool) -> None:
        self.requests.labels(key, usage.model, route).inc()
        if error:
            self.errors.labels(key, usage.model, route).inc()
        for kind, count in (
            ("prompt", usage.prompt_tokens),
            ("cached", usage.cached_tokens),
            ("completion", usage.completion_tokens),
        ):
            if count:
                self.tokens.labels(key, usage.model, kind).inc(count)
