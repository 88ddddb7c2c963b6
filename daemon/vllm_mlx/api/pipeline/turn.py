"""One request, resolved once: the model it runs on and everything it runs under.

Every protocol adapter turns its wire body into a Turn (model, its settings, the one
Settings snapshot, metrics label), its prompt into a Prompt, and builds each neutral
GenerationRequest in one call from them: nothing is looked up twice and nothing is
patched onto a request after it is built.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from litestar import Request

from vllm_mlx.api.errors import bad_request
from vllm_mlx.api.pipeline.acquire import acquire, acquire_adapter, served_entry
from vllm_mlx.api.pipeline.offload import off_loop
from vllm_mlx.api.state import note_model, request_settings, server_state
from vllm_mlx.config.model import ModelSettings
from vllm_mlx.config.settings import Settings
from vllm_mlx.engine.engine import Engine
from vllm_mlx.engine.types import GenerationRequest, SamplingParams, SharedPrefill, TokenConstraint
from vllm_mlx.metrics.core import Metrics
from vllm_mlx.models.vision import ImageTiles
from vllm_mlx.parsers.reasoning import get_reasoning_parser
from vllm_mlx.telemetry import hooks as tracing

T = TypeVar("T")

# Reasoning templates open their block in the prompt's last few tokens ("<think>\n").
PROMPT_TAIL_TOKENS = 16

# A request's `speculative` field: false opts out, true or unset leaves it to the model,
# a method's name asks for that method (docs/speculative.md).
Speculation = bool | Literal["ngram", "draft"]


def requested_speculation(field: Speculation | None) -> Speculation:
    return True if field is None else field


@dataclass(frozen=True)
class Turn:
    """A request's resolved model and the settings snapshot it runs under to the end."""

    model_id: str  # as the client named it (may be an alias)
    name: str  # the served model's name: the metrics label
    engine: Engine
    settings: Settings  # read once: a hot reload mid-request never mixes two configs
    model: ModelSettings | None  # the model's current settings (parsers hot-reload)
    metrics: Metrics | None
    route: str
    adapter: str | None = None  # the LoRA adapter's tag when the id names one

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    async def off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        """fn(*args) (rendering, tokenising) in a worker thread, limits.prompt_timeout bound."""
        limit_s = self.settings.limits.prompt_timeout
        return await off_loop(fn, *args, limit_s=limit_s, metrics=self.metrics)

    async def prompt(self, fn: Callable[..., list[int]], *args: Any) -> Prompt:
        """A prompt rendered and tokenised by fn(*args), off the event loop."""
        with tracing.span("prompt.render"):
            tokens = await self.off_loop(fn, *args)
        return self.prompt_of(tokens)

    def prompt_of(self, tokens: list[int]) -> Prompt:
        opens = False
        if self.model is not None and self.model.reasoning_parser is not None:
            tail = self.tokenizer.decode(tokens[-PROMPT_TAIL_TOKENS:])
            opens = get_reasoning_parser(self.model.reasoning_parser).prompt_opens_reasoning(tail)
        return Prompt(tokens, opens)

    def sampling(
        self,
        *,
        temperature: float | None = None,
        top_p: float | None = None,
        top_k: int | None = None,
        min_p: float | None = None,
        seed: int | None = None,
        repetition_penalty: float | None = None,
        presence_penalty: float | None = None,
        frequency_penalty: float | None = None,
        logit_bias: dict[int, float] | None = None,
        penalty_window: int | None = None,
    ) -> SamplingParams:
        """Request values over the configured defaults, checked against the model.

        Every value the engine could not sample with is a 400 naming its field here, so
        no request reaches a shared batch step with one.
        """
        d = self.settings.defaults
        vocab_size = self.engine.vocab_size
        if top_k is not None and top_k >= vocab_size:
            top_k = 0  # keeping the k most likely of fewer than k tokens keeps them all
        params = SamplingParams(
            temperature=d.temperature if temperature is None else temperature,
            top_p=d.top_p if top_p is None else top_p,
            top_k=d.top_k if top_k is None else top_k,
            min_p=d.min_p if min_p is None else min_p,
            seed=seed,
            repetition_penalty=d.repetition_penalty
            if repetition_penalty is None
            else repetition_penalty,
            presence_penalty=presence_penalty or 0.0,
            frequency_penalty=frequency_penalty or 0.0,
            logit_bias=logit_bias,
            penalty_window=penalty_window,
        )
        for param, message in params.problems(vocab_size):
            raise bad_request(message, param)
        return params

    def allowed_tokens(self, prompt: Prompt, max_tokens: int | None) -> int:
        """The completion tokens this prompt may have: the request's, the configured
        default and limit, and the context; a prompt that cannot fit is a 400 here."""
        wanted = self.settings.defaults.max_tokens if max_tokens is None else max_tokens
        wanted = min(wanted, self.settings.limits.max_request_tokens)
        return self.engine.check_fits(len(prompt.tokens), wanted)

    def request(self, request_id: str, prompt: Prompt, plan: RequestPlan) -> GenerationRequest:
        """The one GenerationRequest of `plan`: built whole, never patched afterwards.

        `plan.timeout` (the request's own) may lower server.timeout, never raise it.
        """
        if plan.ignore_eos and plan.constraint is not None:
            raise bad_request(
                "ignore_eos cannot be combined with a response format, structured outputs "
                "or a forced tool call: the constrained reply ends with the end-of-sequence "
                "token",
                "ignore_eos",
            )
        now = time.monotonic()
        server_timeout = self.settings.server.timeout
        limit = server_timeout if plan.timeout is None else min(plan.timeout, server_timeout)
        return GenerationRequest(
            request_id=request_id,
            prompt_tokens=prompt.tokens,
            max_tokens=plan.max_tokens,
            sampling=plan.sampling,
            stop=plan.stop,
            arrived_at=now,
            deadline=now + limit,
            constraint=plan.constraint,
            logprobs=plan.logprobs,
            logprobs_raw=plan.logprobs_raw,
            prompt_logprobs=plan.prompt_logprobs,
            shared=plan.shared,
            adapter=self.adapter,
            vision=prompt.vision,
            speculative=self.speculation(plan.speculative),
            prediction=plan.prediction,
            ignore_eos=plan.ignore_eos,
        )

    def speculation(self, asked: Speculation) -> Speculation:
        """The request's `speculative` field, refused (400) when it names a draft its
        model does not have (prompt lookup needs nothing: any model can)."""
        if not isinstance(asked, str):
            return asked
        method = self.model.speculative.method if self.model is not None else None
        if asked == "draft" and method != "draft":
            has = f"its speculative method is {method}" if method else "no speculative section"
            raise bad_request(
                f"speculative: 'draft' asks for a draft model, and model '{self.name}' has "
                f"none ({has}); use 'ngram' or true",
                "speculative",
            )
        return asked


@dataclass(frozen=True)
class Prompt:
    """A request's prompt tokens and what its end says about the model's reasoning."""

    tokens: list[int]
    opens_reasoning: bool = False  # the template left the reasoning block open
    # Its images' tiles (api/pipeline/vision.py); the tokens hold their placeholders.
    vision: ImageTiles | None = None


@dataclass(frozen=True)
class RequestPlan:
    """Everything of a GenerationRequest but its id and prompt (see Turn.request)."""

    max_tokens: int
    sampling: SamplingParams
    stop: tuple[str, ...] = ()
    timeout: float | None = None
    constraint: TokenConstraint | None = None
    logprobs: int | None = None
    logprobs_raw: bool = False
    prompt_logprobs: int | None = None
    shared: SharedPrefill | None = None
    speculative: Speculation = True  # the request's field (requested_speculation)
    prediction: tuple[int, ...] = ()  # Predicted Outputs' text, as token ids
    ignore_eos: bool = False  # the request's field (OpenAI routes: vLLM's extra)


# What a model of each other task is, and the routes it does serve (for the 400).
_NOT_GENERATIVE = {
    "embed": ("an embedding", "POST /v1/embeddings"),
    "rerank": ("a rerank", "rerank"),
    "transcribe": ("a speech-to-text", "POST /v1/audio/transcriptions and translations"),
}


async def resolve_turn(request: Request[Any, Any, Any], model_id: str, route: str) -> Turn:
    """The model's engine, loaded first when needed, held until the response is over."""
    state = server_state(request)
    settings = request_settings(request)
    entry = served_entry(state, model_id)
    note_model(request.scope, model_id)
    if entry.settings.task != "generate":
        kind, route = _NOT_GENERATIVE[entry.settings.task]
        raise bad_request(
            f"model '{model_id}' is {kind} model: it serves {route} requests only, "
            f"not text generation",
            "model",
            "model_not_generative",
        )
    await acquire(state, entry, model_id)
    assert entry.engine is not None  # acquire: running, and a generation model's runner
    scheduler = entry.engine.scheduler
    name = entry.settings.name
    if scheduler.on_step is None:
        # Steps only happen for submitted requests, so hooking here misses none.
        scheduler.on_step = state.metrics.step_hook(name)
        if scheduler.vision is not None:
            scheduler.vision.on_encode = state.metrics.vision_hook(name)
    model = next((m for m in settings.models if m.name == name), None)
    adapter = await acquire_adapter(state, entry, model_id)
    return Turn(model_id, name, entry.engine, settings, model, state.metrics, route, adapter)
