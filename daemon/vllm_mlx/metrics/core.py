"""Every Prometheus metric in one place, on an injected registry.

Names, label (`model_name`) and histogram buckets follow vLLM's, so dashboards built
for vLLM work unchanged; `vllm_mlx_*` metrics cover what vLLM has no name for.
Counters and histograms are updated at the event they count (a token arriving, a
request finishing, a step ending); only gauges of live state (running requests,
memory, model state) are read when Prometheus scrapes, by a collector.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from vllm_mlx.metrics.activity import Activity
from vllm_mlx.metrics.buckets import (
    ABORT_REASONS,
    CACHED_SHARE_BUCKETS,
    DEFAULT_TOKEN_BUCKET_MAX,
    FINISH_REASONS,
    HTTP_LATENCY_BUCKETS,
    ITERATION_TOKENS_BUCKETS,
    ITL_BUCKETS,
    MASK_BUCKETS,
    MCP_CALL_BUCKETS,
    REQUEST_LATENCY_BUCKETS,
    TTFT_BUCKETS,
    build_1_2_5_buckets,
)
from vllm_mlx.metrics.keys import KeyMetrics
from vllm_mlx.metrics.live import (
    GroupCollector,
    GroupSource,
    LiveCollector,
    LiveSource,
)

if TYPE_CHECKING:
    from vllm_mlx.engine.output import RequestTrace

# Without its charset: Litestar appends `; charset=utf-8` to every text/* type, and a
# repeated parameter makes strict parsers (Go's mime, so Prometheus 3) refuse the scrape.
CONTENT_TYPE = ";".join(
    part
    for part in prometheus_client.CONTENT_TYPE_LATEST.split(";")
    if not part.strip().lower().startswith("charset=")
)


class Metrics:
    """The daemon's metrics on its own registry (never the process-global one)."""

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        token_bucket_max: int = DEFAULT_TOKEN_BUCKET_MAX,
    ) -> None:
        # *_created series double the output and no vLLM dashboard reads them.
        prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = registry if registry is not None else CollectorRegistry()
        self.started_at = time.time()
        self.activity = Activity()  # the status page's last ten minutes
        self.keys = KeyMetrics(self.registry)  # the `key`-labelled usage counters
        self._live: LiveCollector | None = None
        self._models: set[str] = set()
        self._define_engine_metrics(build_1_2_5_buckets(token_bucket_max))
        self._define_server_metrics()

    def _counter(self, name: str, doc: str, labels: Sequence[str] = ("model_name",)) -> Counter:
        return Counter(name, doc, list(labels), registry=self.registry)

    def _histogram(
        self, name: str, doc: str, buckets: Sequence[float], labels: Sequence[str] = ("model_name",)
    ) -> Histogram:
        return Histogram(name, doc, list(labels), registry=self.registry, buckets=buckets)

    def _define_engine_metrics(self, token_buckets: Sequence[float]) -> None:
        c, h = self._counter, self._histogram
        self.prompt_tokens = c("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = c("vllm:generation_tokens", "Number of generation tokens.")
        self.request_success = c(
            "vllm:request_success",
            "Count of finished requests, by finish reason (abort: client gone or timed out).",
            ("model_name", "finished_reason"),
        )
        self.prefix_cache_queries = c(
            "vllm:prefix_cache_queries", "Prefix cache queries, in prompt tokens looked up."
        )
        self.prefix_cache_hits = c(
            "vllm:prefix_cache_hits", "Prefix cache hits, in prompt tokens reused from the cache."
        )
        self.cached_share = h(
            "vllm_mlx_prompt_cached_fraction",
            "Share of each prompt (0 to 1) that the prefix cache supplied.",
            CACHED_SHARE_BUCKETS,
        )
        self.ttft = h(
            "vllm:time_to_first_token_seconds", "Time to first token in seconds.", TTFT_BUCKETS
        )
        self.itl = h("vllm:inter_token_latency_seconds", "Inter-token latency.", ITL_BUCKETS)
        latency = REQUEST_LATENCY_BUCKETS
        self.e2e = h("vllm:e2e_request_latency_seconds", "End-to-end request latency.", latency)
        self.queue_time = h(
            "vllm:request_queue_time_seconds", "Time spent waiting in the queue.", latency
        )
        self.prefill_time = h("vllm:request_prefill_time_seconds", "Time in prefill.", latency)
        self.decode_time = h("vllm:request_decode_time_seconds", "Time in decode.", latency)
        self.request_prompt_tokens = h(
            "vllm:request_prompt_tokens", "Prompt tokens per request.", token_buckets
        )
        self.request_generation_tokens = h(
            "vllm:request_generation_tokens", "Generated tokens per request.", token_buckets
        )
        self.iteration_tokens = h(
            "vllm:iteration_tokens_total",
            "Tokens (prompt + generated) per engine step.",
            ITERATION_TOKENS_BUCKETS,
        )
        self.structured_mask = h(
            "vllm_mlx_structured_mask_seconds",
            "Time to compute and apply one constrained request's token mask, per token.",
            MASK_BUCKETS,
        )
        self.aborted = c(
            "vllm_mlx_aborted_requests",
            "Generations aborted before their end, by reason.",
            ("model_name", "reason"),
        )
        self.embedding_requests = c(
            "vllm_mlx_embedding_requests", "Embedding requests answered (POST /v1/embeddings)."
        )
        self.embedding_inputs = c("vllm_mlx_embedding_inputs", "Inputs embedded.")
        self.embedding_tokens = c("vllm_mlx_embedding_input_tokens", "Input tokens embedded.")
        self.embedding_latency = h(
            "vllm_mlx_embedding_request_duration_seconds",
            "Time from an embedding request's arrival to its vectors.",
            HTTP_LATENCY_BUCKETS,
        )
        self.rerank_requests = c(
            "vllm_mlx_rerank_requests", "Rerank and score requests answered (/v1/rerank, /score)."
        )
        self.rerank_documents = c(
            "vllm_mlx_rerank_documents", "Documents (score: text pairs) scored by rerankers."
        )
        self.images = c("vllm_mlx_images", "Images received in generation requests.")
        self.image_bytes = c("vllm_mlx_image_bytes", "Encoded bytes of the images received.")
        self.vision_encode = h(
            "vllm_mlx_vision_encode_seconds",
            "Time the vision tower took to encode one request's image tiles.",
            HTTP_LATENCY_BUCKETS,
        )
        self.audio_requests = c(
            "vllm_mlx_audio_requests",
            "Transcription and translation requests answered (/v1/audio/*).",
        )
        self.audio_seconds = c(
            "vllm_mlx_audio_seconds", "Seconds of decoded audio transcribed or translated."
        )

    def _define_server_metrics(self) -> None:
        c = self._counter
        self.http_requests = c(
            "vllm_mlx_http_requests",
            "HTTP requests answered, by route template, method and status class.",
            ("route", "method", "status"),
        )
        self.http_latency = self._histogram(
            "vllm_mlx_http_request_duration_seconds",
            "Time from request start to the last byte of the response.",
            HTTP_LATENCY_BUCKETS,
            ("route", "method"),
        )
        self.unauthorized = c(
            "vllm_mlx_unauthorized_requests",
            "Requests refused with 401 (API key missing or wrong).",
            ("reason",),
        )
        self.rate_limited = c("vllm_mlx_rate_limited_requests", "Requests refused with 429.", ())
        self.prompts_preparing = Gauge(
            "vllm_mlx_prompts_preparing",
            "Prompts being rendered and tokenised in worker threads, off the event loop.",
            registry=self.registry,
        )
        self.config_reloads = c(
            "vllm_mlx_config_reloads", "Config file reloads, by result.", ("result",)
        )
        self.mcp_calls = c(
            "vllm_mlx_mcp_tool_calls",
            "MCP tool calls, by server, tool and outcome (ok, tool_error, timeout, unavailable).",
            ("server", "tool", "outcome"),
        )
        self.mcp_latency = self._histogram(
            "vllm_mlx_mcp_tool_call_duration_seconds",
            "Time one MCP tool call took, by server.",
            MCP_CALL_BUCKETS,
            ("server",),
        )
        for reason in ("missing", "invalid"):
            self.unauthorized.labels(reason)
        for result in ("success", "failure"):
            self.config_reloads.labels(result)

    # --- wiring -----------------------------------------------------------------------

    def watch(self, source: LiveSource) -> None:
        """Read live gauges from source at every scrape (set once)."""
        if self._live is None:
            self._live = LiveCollector(source)
            self.registry.register(self._live)

    def watch_group(self, source: GroupSource) -> None:
        """Rank 0 of a distributed group: per-rank gauges read at every scrape."""
        self.registry.register(GroupCollector(source))

    def add_model(self, name: str) -> None:
        """Create a model's labelled series so they read 0 before the first request."""
        if name in self._models:
            return
        self._models.add(name)
        for metric in (
            self.prompt_tokens, self.generation_tokens, self.prefix_cache_queries,
            self.prefix_cache_hits, self.cached_share, self.ttft, self.itl, self.e2e,
            self.queue_time, self.prefill_time, self.decode_time, self.request_prompt_tokens,
            self.request_generation_tokens, self.iteration_tokens, self.structured_mask,
        ):  # fmt: skip
            metric.labels(name)
        for reason in FINISH_REASONS:
            self.request_success.labels(name, reason)
        for reason in ABORT_REASONS:
            self.aborted.labels(name, reason)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    # --- events -----------------------------------------------------------------------

    def step_hook(self, model: str) -> Callable[[int, int], None]:
        """The engine thread's per-step callback for one model (one histogram observe)."""
        self.add_model(model)
        child = self.iteration_tokens.labels(model)
        activity = self.activity

        def on_step(prompt_tokens: int, generated_tokens: int) -> None:
            child.observe(prompt_tokens + generated_tokens)
            activity.tokens(prompt_tokens, generated_tokens)

        return on_step

    def mask_observer(self, model: str) -> Callable[[float], None]:
        """Per-token mask time of constrained requests (called on the engine thread)."""
        self.add_model(model)
        return self.structured_mask.labels(model).observe

    def request(self, model: str, prompt_tokens: int) -> RequestMetrics:
        self.add_model(model)
        return RequestMetrics(self, model, prompt_tokens)

    def images_received(self, model: str, count: int, nbytes: int) -> None:
        self.images.labels(model).inc(count)
        self.image_bytes.labels(model).inc(nbytes)

    def vision_hook(self, model: str) -> Callable[[float, int], None]:
        """The engine thread's callback after each vision encode (seconds, tiles)."""
        child = self.vision_encode.labels(model)

        def on_encode(seconds: float, _tiles: int) -> None:
            child.observe(seconds)

        return on_encode

    def rerank_request(self, model: str, documents: int) -> None:
        self.rerank_requests.labels(model).inc()
        self.rerank_documents.labels(model).inc(documents)

    def audio_request(self, model: str, seconds: float) -> None:
        self.audio_requests.labels(model).inc()
        self.audio_seconds.labels(model).inc(seconds)

    def embedding_request(self, model: str, inputs: int, tokens: int, seconds: float) -> None:
        self.embedding_requests.labels(model).inc()
        self.embedding_inputs.labels(model).inc(inputs)
        self.embedding_tokens.labels(model).inc(tokens)
        self.embedding_latency.labels(model).observe(seconds)

    def http_request(self, route: str, method: str, status: int, seconds: float) -> None:
        self.http_requests.labels(route, method, f"{status // 100}xx").inc()
        self.http_latency.labels(route, method).observe(seconds)

    def mcp_call(self, server: str, tool: str, outcome: str, seconds: float) -> None:
        self.mcp_calls.labels(server, tool, outcome).inc()
        self.mcp_latency.labels(server).observe(seconds)

    def config_reloaded(self, success: bool) -> None:
        self.config_reloads.labels("success" if success else "failure").inc()


class RequestMetrics:
    """One generation's observations, taken from its RequestTrace as events arrive."""

    def __init__(self, metrics: Metrics, model: str, prompt_tokens: int) -> None:
        self._m = metrics
        self._model = model
        self._prompt_tokens = prompt_tokens
        self._itl = metrics.itl.labels(model)
        self._tokens = metrics.generation_tokens.labels(model)
        self._times_seen = 0
        self._tokens_seen = 0
        self._prefill_seen = False
        self._ttft_seen = False
        self._done = False

    def update(self, trace: RequestTrace) -> None:
        """Count what the trace gained since the last call (tokens, ITL, TTFT, prefill)."""
        if not self._prefill_seen and trace.prefill_done_at is not None:
            self._prefill_seen = True
            self._m.prompt_tokens.labels(self._model).inc(self._prompt_tokens)
            # vLLM counts prefix-cache queries and hits in tokens.
            self._m.prefix_cache_queries.labels(self._model).inc(self._prompt_tokens)
            self._m.prefix_cache_hits.labels(self._model).inc(trace.cached_tokens)
            if self._prompt_tokens:
                share = trace.cached_tokens / self._prompt_tokens
                self._m.cached_share.labels(self._model).observe(share)
            started = trace.prefill_started_at or trace.arrived_at
            self._m.queue_time.labels(self._model).observe(max(0.0, started - trace.arrived_at))
            self._m.prefill_time.labels(self._model).observe(
                max(0.0, trace.prefill_done_at - started)
            )
        if not self._ttft_seen and trace.first_token_at is not None:
            self._ttft_seen = True
            self._m.ttft.labels(self._model).observe(trace.first_token_at - trace.arrived_at)
        times = trace.token_times
        for index in range(max(self._times_seen, 1), len(times)):
            self._itl.observe(times[index] - times[index - 1])
        self._times_seen = len(times)
        if trace.completion_tokens > self._tokens_seen:
            self._tokens.inc(trace.completion_tokens - self._tokens_seen)
            self._tokens_seen = trace.completion_tokens

    def finished(self, trace: RequestTrace, reason: str, now: float) -> None:
        """The request ended with a result (any finish reason the engine reports)."""
        if self._done:
            return
        self.update(trace)
        self._done = True
        model, m = self._model, self._m
        if not self._ttft_seen:
            # The first sampled token was end-of-sequence: it still ends the wait.
            m.ttft.labels(model).observe(now - trace.arrived_at)
        end = trace.finished_at or now
        m.e2e.labels(model).observe(end - trace.arrived_at)
        decode_from = trace.prefill_done_at or trace.first_token_at or end
        m.decode_time.labels(model).observe(max(0.0, end - decode_from))
        m.request_prompt_tokens.labels(model).observe(self._prompt_tokens)
        m.request_generation_tokens.labels(model).observe(trace.completion_tokens)
        label = reason if reason in FINISH_REASONS else "stop"  # tool_calls ends as a stop
        m.request_success.labels(model, label).inc()

    def failed(self, trace: RequestTrace) -> None:
        """The engine failed or refused the request: counted as `error`."""
        if self._done:
            return
        self.update(trace)
        self._done = True
        self._m.request_success.labels(self._model, "error").inc()

    def aborted(self, trace: RequestTrace, reason: str) -> None:
        """The generation was cut short: the client left or the deadline passed."""
        if self._done:
            return
        self.update(trace)
        self._done = True
        self._m.aborted.labels(self._model, reason).inc()
        self._m.request_success.labels(self._model, "abort").inc()
