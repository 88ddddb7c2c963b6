"""Grammar masks for structured outputs: a neutral Constraint in, a token mask per step out.

llguidance does the grammar work (JSON schema, regex, Lark; what vLLM, SGLang and
llama.cpp use): it compiles a constraint against the model's own tokenizer and, for
each step, fills a bitmask of the tokens that keep the output valid in tens of
microseconds. This module turns that into an mlx-lm logits processor for one request,
so the mask only ever touches that request's row of the batch.

Compiling is for a worker thread (the API's request pool), bounded in size and time;
compiled grammars are kept in a small LRU keyed by the constraint's hash and copied per
request (a fresh matcher from a cached one costs microseconds).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import llguidance
import mlx.core as mx
import numpy as np
import structlog

from vllm_mlx.engine.constraint_errors import describe_error
from vllm_mlx.engine.types import EngineError

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

log = structlog.get_logger(__name__)

ConstraintKind = Literal["json_schema", "json_object", "regex", "choice", "grammar"]
MaskObserver = Callable[[float], None]
LogitsProcessor = Callable[[mx.array, mx.array], mx.array]

MAX_CONSTRAINT_CHARS = 256 * 1024  # the schema/regex/grammar text, serialised
COMPILE_TIMEOUT_S = 10.0
CACHE_ENTRIES = 64
# Compact JSON: small models at temperature 1 otherwise pad with whitespace forever.
_JSON_OPTIONS: JsonCompileOptions = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
}


class ConstraintError(EngineError):
    """The schema, regex or grammar is invalid or cannot be enforced (a 400)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class Constraint:
    """What the output must match. ``value``: a schema dict (json_schema), a pattern
    (regex), a list of strings (choice), Lark or GBNF text (grammar), None (json_object).
    ``param`` names the request field it came from, for error messages."""

    kind: ConstraintKind
    value: Any = None
    param: str | None = None

    def key(self) -> str:
        text = json.dumps([self.kind, self.value], sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class ReasoningGate:
    """Leave the reasoning free: the constraint starts after ``close_tokens``.

    ``inside``: the prompt already opened the reasoning block. Otherwise the first
    token may be ``open_token`` (a model that opens the block itself), or the answer.
    """

    close_tokens: tuple[int, ...]
    inside: bool = False
    open_token: int | None = None


@dataclass
class CompiledConstraint:
    """A compiled grammar, ready to give each request its own matcher."""

    template: llguidance.LLMatcher
    vocab_size: int
    eos_token: int
    compile_seconds: float = 0.0
    observe: MaskObserver | None = field(default=None, compare=False)

    def make_processor(self, gate: ReasoningGate | None = None) -> LogitsProcessor:
        return _MaskProcessor(self, gate)

    def bind(self, gate: ReasoningGate | None) -> RequestConstraint:
        return RequestConstraint(self, gate)


@dataclass(frozen=True)
class RequestConstraint:
    """What a GenerationRequest carries: the compiled grammar and its reasoning gate."""

    compiled: CompiledConstraint
    gate: ReasoningGate | None = None

    def make_processor(self) -> LogitsProcessor:
        return self.compiled.make_processor(self.gate)


class _MaskProcessor:
    """Advances this request's matcher with each sampled token and masks its row.

    mlx-lm calls it once per sampled token with the sequence's tokens so far: the
    last one is the token sampled at the previous call (the prompt's last at the first).
    """

    def __init__(self, compiled: CompiledConstraint, gate: ReasoningGate | None) -> None:
        self._matcher = compiled.template.deep_copy()
        self._compiled = compiled
        self._words = np.zeros((compiled.vocab_size + 31) // 32, dtype=np.int32)
        self._gate = gate
        # "open": first step may open reasoning; "free": reasoning; "on": constrained.
        self._phase = "on"
        if gate is not None and gate.inside:
            self._phase = "free"
        elif gate is not None and gate.open_token is not None:
            self._phase = "open"
        self._calls = 0
        self._recent: list[int] = []
        self.failed = ""

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        # Reading the last token waits for the previous step; that is not mask time.
        last = int(tokens[-1].item()) if self._calls > 0 else None  # type: ignore[arg-type]
        started = time.perf_counter()
        if last is not None:
            self._advance(last)
        self._calls += 1
        if self._phase == "free":
            return logits
        allowed = self._allowed()
        if self._phase == "open":
            assert self._gate is not None and self._gate.open_token is not None
            allowed[self._gate.open_token] = True
        masked = _apply(logits, allowed)
        if self._compiled.observe is not None:
            self._compiled.observe(time.perf_counter() - started)
        return masked

    def _advance(self, token: int) -> None:
        if self._phase == "open":
            assert self._gate is not None
            if token == self._gate.open_token:
                self._phase = "free"
                return
            self._phase = "on"
        if self._phase == "free":
            assert self._gate is not None
            close = self._gate.close_tokens
            self._recent = [*self._recent, token][-len(close) :]
            if tuple(self._recent) == close:
                self._phase = "on"  # the next token is the answer's first
            return
        if not self.failed and not self._matcher.consume_token(token):
            self.failed = self._matcher.get_error() or "token rejected"
            log.warning("constraint failed; ending the sequence", error=self.failed, token=token)

    def _allowed(self) -> np.ndarray[Any, np.dtype[np.bool_]]:
        vocab = self._compiled.vocab_size
        if self.failed or self._matcher.is_error():
            # Cannot happen with a sound mask; end the sequence rather than fail the batch.
            allowed = np.zeros(vocab, dtype=np.bool_)
            allowed[self._compiled.eos_token] = True
            return allowed
        words = self._words
        self._matcher.unsafe_compute_mask_ptr(words.ctypes.data, words.nbytes)
        bits = np.unpackbits(words.view(np.uint8), bitorder="little")[:vocab]
        return bits.astype(np.bool_)


def _apply(logits: mx.array, allowed: np.ndarray[Any, np.dtype[np.bool_]]) -> mx.array:
    """-inf outside ``allowed`` on this request's (1, vocab) row; the model's vocabulary
    may be padded past the tokenizer's, and padding is never allowed."""
    width = logits.shape[-1]
    if allowed.shape[0] < width:
        allowed = np.concatenate([allowed, np.zeros(width - allowed.shape[0], dtype=np.bool_)])
    mask = mx.array(allowed[:width])
    return mx.where(mask, logits, mx.array(-float("inf"), dtype=logits.dtype))


# --- compiling -------------------------------------------------------------------------


def grammar_text(constraint: Constraint) -> str:
    """The llguidance grammar for a constraint (not yet checked)."""
    kind, value = constraint.kind, constraint.value
    if kind == "json_object":
        return str(llguidance.LLMatcher.grammar_from_json_schema({"type": "object"}, _JSON_OPTIONS))
    if kind == "json_schema":
        if isinstance(value, bool):
            value = {} if value else {"not": {}}
        if not isinstance(value, dict):
            raise ConstraintError("the JSON schema must be an object", constraint.param)
        return str(llguidance.LLMatcher.grammar_from_json_schema(value, _JSON_OPTIONS))
    if kind == "regex":
        return str(llguidance.LLMatcher.grammar_from_regex(str(value)))
    if kind == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) for c in value):
            raise ConstraintError("choice must be a non-empty list of strings", constraint.param)
        alternatives = " | ".join(json.dumps(c) for c in value)
        return str(llguidance.LLMatcher.grammar_from_lark(f"start: {alternatives}\n"))
    text = str(value)
    if "::=" in text:  # GBNF (llama.cpp's grammar format), as vLLM accepts too
        from llguidance.gbnf_to_lark import gbnf_to_lark

        try:
            text = gbnf_to_lark(text)
        except Exception as exc:
            raise ConstraintError(f"invalid GBNF grammar: {exc}", constraint.param) from exc
    return str(llguidance.LLMatcher.grammar_from_lark(text))


def _limits() -> llguidance.LLParserLimits:
    # Bounds compile work (lexer fuel, grammar size) well below llguidance's defaults,
    # which are sized for servers with many cores to spare.
    return llguidance.LLParserLimits(
        initial_lexer_fuel=500_000, max_grammar_size=200_000, verbose_errors=False
    )


class ConstraintCompiler:
    """One model's compiler: its llguidance tokenizer and an LRU of compiled grammars."""

    def __init__(
        self,
        hf_tokenizer: Any,
        eos_token_ids: Sequence[int],
        cache_entries: int = CACHE_ENTRIES,
    ) -> None:
        self._hf = hf_tokenizer
        self._eos = sorted(eos_token_ids)
        self._tokenizer: llguidance.LLTokenizer | None = None
        self._cache: OrderedDict[str, CompiledConstraint] = OrderedDict()
        self._entries = cache_entries
        self._lock = threading.Lock()
        self.observe: MaskObserver | None = None
        self.compile_timeout = COMPILE_TIMEOUT_S

    def tokenizer(self) -> llguidance.LLTokenizer:
        """Built once from the model's own tokenizer (~0.2 s), on first use."""
        with self._lock:
            if self._tokenizer is None:
                self._tokenizer = make_ll_tokenizer(self._hf, self._eos)
            return self._tokenizer

    def compile(self, constraint: Constraint) -> CompiledConstraint:
        """Blocking (up to compile_timeout): callers run it off the event loop."""
        try:
            key = constraint.key()
        except (RecursionError, TypeError, ValueError) as exc:
            raise ConstraintError(
                f"the constraint cannot be read: {exc}", constraint.param
            ) from exc
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                self._cache.move_to_end(key)
                return cached
        compiled = self._compile(constraint)
        with self._lock:
            self._cache[key] = compiled
            while len(self._cache) > self._entries:
                self._cache.popitem(last=False)
        return compiled

    def _compile(self, constraint: Constraint) -> CompiledConstraint:
        size = len(json.dumps(constraint.value))
        if size > MAX_CONSTRAINT_CHARS:
            raise ConstraintError(
                f"the constraint is {size} characters; at most {MAX_CONSTRAINT_CHARS} are allowed",
                constraint.param,
            )
        started = time.perf_counter()
        tokenizer = self.tokenizer()
        try:
            grammar = grammar_text(constraint)
        except ValueError as exc:
            raise ConstraintError(str(exc), constraint.param) from exc
        matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0, limits=_limits())
        if matcher.is_error():
            raise _refused(constraint, matcher.get_error())
        compiled = CompiledConstraint(
            matcher,
            tokenizer.vocab_size,
            self._eos[0],
            time.perf_counter() - started,
        )
        compiled.observe = self._observe
        return compiled

    def _observe(self, seconds: float) -> None:
        if self.observe is not None:
            self.observe(seconds)

    @property
    def cached(self) -> int:
        return len(self._cache)


def _refused(constraint: Constraint, message: str) -> ConstraintError:
    text = describe_error(constraint.kind, constraint.value, message)
    return ConstraintError(text, constraint.param)


def make_ll_tokenizer(hf_tokenizer: Any, eos_token_ids: Sequence[int]) -> llguidance.LLTokenizer:
    """llguidance's token table from a Hugging Face fast tokenizer (the GGUF-imported
    one included: it is a ``tokenizer.json`` built with the tokenizers library)."""
    backend = getattr(hf_tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise ConstraintError("structured outputs need a fast (tokenizers) tokenizer")
    return llguidance.LLTokenizer(backend.to_str(), eos_token=list(eos_token_ids))
