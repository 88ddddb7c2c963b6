"""The `models` section of vllm-mlx.yaml: one entry per served model."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import field_validator, model_validator

from vllm_mlx.config.adapters import AdapterSettings
from vllm_mlx.config.fields import LocatedError, Reload, Section, setting
from vllm_mlx.config.kv_cache import KVCacheSettings
from vllm_mlx.config.speculative import SpeculativeSettings
from vllm_mlx.models.sources import check_source

MAX_KEEP_ALIVE_S = 365 * 24 * 3600  # a year: beyond it, say -1


MAX_WARM_PROMPT_BYTES = 1024 * 1024  # a system prompt, not a corpus


class WarmPrompt(Section):
    """A warm prompt: its text, or a file (UTF-8) holding it, e.g. an agent's system
    prompt. A bare string in the YAML is the text."""

    text: str | None = setting(None, Reload.MODEL, "The prompt itself.")
    file: Path | None = setting(None, Reload.MODEL, "A file whose text is the prompt.")

    @model_validator(mode="before")
    @classmethod
    def _bare_text(cls, value: Any) -> Any:
        return {"text": value} if isinstance(value, str) else value

    @field_validator("file")
    @classmethod
    def _readable(cls, value: Path | None) -> Path | None:
        if value is None:
            return None
        path = value.expanduser()
        if not path.is_file():
            raise ValueError(f"warm prompt file {str(path)!r} does not exist")
        if path.stat().st_size > MAX_WARM_PROMPT_BYTES:
            raise ValueError(f"warm prompt file {str(path)!r} is larger than 1 MiB")
        try:
            path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"warm prompt file {str(path)!r} is not UTF-8 text: {exc}") from exc
        return path

    @model_validator(mode="after")
    def _one_of(self) -> WarmPrompt:
        if (self.text is None) == (self.file is None):
            raise ValueError("a warm prompt is its text or `{file: PATH}`, exactly one")
        return self

    def prompt(self) -> str:
        if self.file is not None:
            return self.file.read_text(encoding="utf-8")
        return self.text or ""


class ModelSettings(Section):
    name: str = setting(..., Reload.MODEL, "The id clients send as `model`.", min_length=1)
    source: str = setting(
        ...,
        Reload.MODEL,
        "Where the weights come from: a Hugging Face repo id (`org/name`), a local mlx-lm "
        "model directory, a local `.gguf` file, or `builtin:smollm2-135m-instruct`.",
        min_length=1,
    )
    aliases: list[str] = setting([], Reload.HOT, "Other ids that reach this model.")
    task: Literal["generate", "embed", "rerank", "transcribe"] = setting(
        "generate",
        Reload.MODEL,
        "`generate`: a chat/completion model (mlx-lm); `embed`: a sentence-embedding "
        "model served on /v1/embeddings (a BERT encoder, e.g. "
        "`builtin:all-minilm-l6-v2`), see docs/embeddings.md; `rerank`: a relevance "
        "scorer served on /v1/rerank, /v2/rerank and /score, see docs/rerank.md; "
        "`transcribe`: a Whisper model (mlx-whisper) served on /v1/audio/transcriptions "
        "and /v1/audio/translations, see docs/audio.md.",
    )
    vision: bool | None = setting(
        None,
        Reload.MODEL,
        "Vision-language models (docs/vision.md): `null` detects one from its config.json "
        "(a `vision_config`) and loads its image tower through mlx-vlm; `true` requires "
        "one (a load error otherwise); `false` serves its text model alone. `task: vision` "
        "is read as `task: generate` with `vision: true`.",
    )
    rerank_method: Literal["cross_encoder", "llm", "embedding"] | None = setting(
        None,
        Reload.MODEL,
        "Rerank models: how a (query, document) pair is scored. `cross_encoder`: a BERT "
        "with a one-label classification head; `llm`: P(yes) of a causal LM asked whether "
        "the document meets the query (the Qwen3-Reranker method); `embedding`: cosine of "
        "two sentence embeddings (the weakest). Default: chosen from the model's files.",
    )
    pooling: Literal["mean", "cls", "last"] | None = setting(
        None,
        Reload.MODEL,
        "Embedding models: how token vectors become one vector; default: the model's "
        "own sentence-transformers pooling config, else `mean`.",
    )
    normalize: bool = setting(
        True, Reload.MODEL, "Embedding models: scale every vector to unit length."
    )
    matryoshka: bool = setting(
        False,
        Reload.HOT,
        "Embedding models trained Matryoshka-style: requests may ask for fewer "
        "`dimensions` (the vector is truncated and re-normalised); otherwise that is a 400.",
    )
    revision: str | None = setting(
        None, Reload.MODEL, "Hugging Face revision (branch, tag or commit) for hub sources."
    )
    context_length: int | None = setting(
        None,
        Reload.MODEL,
        "Largest prompt + completion in tokens (embedding models: the longest input); "
        "default: the model's own maximum.",
        gt=0,
    )
    dtype: Literal["auto", "float32", "float16", "bfloat16", "quantized"] = setting(
        "auto",
        Reload.MODEL,
        "Weight format served: `quantized` keeps the stored weights; `auto` picks by "
        "backend (on the Linux CPU: the stored 4/8-bit weights through the built quantized "
        "kernel; without the kernel, float32 when an optimized BLAS is loaded, which decodes "
        "several times faster than MLX's own CPU quantized matmul; otherwise the stored "
        "format). `vllm-mlx models` shows the path each model takes. See docs/benchmarks.md.",
    )
    int8_activations: bool = setting(
        False,
        Reload.MODEL,
        "CPU kernel only: round each layer's input to int8 per 32 values (as llama.cpp's "
        "Q8 activations) and multiply bytes (AVX-512 VNNI, else AVX2): faster "
        "single-stream decoding (1.5x on the bundled model, Zen 4; the matmuls 1.7x for 4-bit "
        "weights on AVX2, Zen 3). Outputs differ slightly from the exact path (~0.5% relative "
        "error per product; 96% of next-token choices agree), so greedy "
        "text can differ; a request still gets the same output alone or batched. Ignored, "
        "with the reason in `vllm-mlx models`, where the CPU lacks AVX2 (arm64), on a GPU, "
        "or off the kernel path. See docs/benchmarks.md.",
        strict=True,
    )

    load: Literal["startup", "on_demand"] | None = setting(
        None,
        Reload.HOT,
        "When the weights are loaded: `startup` (as the daemon starts) or `on_demand` (by "
        "the first request for the model, which waits for the load). Default: `startup` "
        "for the first model, `on_demand` for every other. A change applies at the next "
        "start; `POST /v1/models/{id}/load` loads one now (docs/models.md).",
    )
    keep_alive: float = setting(
        -1,
        Reload.HOT,
        "Seconds a loaded model may sit idle (no request running) before it is unloaded "
        "to free its memory; `-1`: never; `0`: as soon as its last request ends.",
        strict=True,
    )
    pin: bool = setting(
        False,
        Reload.HOT,
        "Never evict this model to make room for another under `memory.budget_*` "
        "(keep_alive and an explicit unload still apply).",
        strict=True,
    )

    enable_auto_tool_choice: bool = setting(
        False,
        Reload.HOT,
        "Parse tool calls out of the model's output (needs `tool_call_parser`). Without it, "
        "requests with tools still render them in the chat template, but calls come back "
        "as plain content.",
    )
    tool_call_parser: str | None = setting(
        None, Reload.HOT, "Tool-call format of this model (docs/tool-calling.md lists them)."
    )
    reasoning_parser: str | None = setting(
        None, Reload.HOT, "Reasoning format of this model: `qwen3` or `deepseek_r1`."
    )
    mcp_tools: Literal["none", "offer", "execute"] = setting(
        "none",
        Reload.HOT,
        "MCP tools in chat and messages requests: `offer` adds the allowed MCP tools to the "
        "tools a request offers (the request's own win on a name clash); `execute` also "
        "runs the model's MCP tool calls in the daemon and generates again (docs/mcp.md).",
    )
    warm_prompts: list[WarmPrompt] = setting(
        [],
        Reload.MODEL,
        "System prompts (text, or `{file: PATH}`) prefilled into the prefix cache when "
        "the model loads, before it reports ready: the first request that opens with "
        "one (an agent's system prompt) skips that prefill (docs/caching.md).",
        leaf=True,
    )
    kv_cache: KVCacheSettings = setting(
        KVCacheSettings(),
        Reload.MODEL,
        "Quantization of the live KV cache: `bits` (4, 8 or unset), `group_size`, "
        "`quantized_after` (docs/caching.md).",
    )
    speculative: SpeculativeSettings = setting(
        SpeculativeSettings(),
        Reload.MODEL,
        "Speculative decoding inside the continuous batch: `method` (`ngram`, `draft` or "
        "unset), `draft_model`, `num_tokens`, `ngram_min`, `ngram_max` "
        "(docs/speculative.md).",
    )
    adapters: list[AdapterSettings] = setting(
        [],
        Reload.HOT,
        "LoRA adapters (mlx-lm adapter directories: `{name, path}`) served beside this "
        "model under their own ids (`name` and `<model>:<name>`), batched with it; loaded "
        "on first use, a change reloads that adapter only (docs/adapters.md).",
        leaf=True,
    )
    structured_outputs: Literal["llguidance", "off"] = setting(
        "llguidance",
        Reload.HOT,
        "Constrained decoding for `response_format` JSON schemas, regex/choice/grammar "
        "requests and forced tool calls (docs/structured-outputs.md): `llguidance` masks "
        "each token with a grammar; `off` refuses such requests with a 400 and forced tool "
        "choices fall back to prompting.",
    )

    @field_validator("keep_alive")
    @classmethod
    def _keep_alive_range(cls, value: float) -> float:
        if value != -1 and not 0 <= value <= MAX_KEEP_ALIVE_S:
            raise ValueError(
                f"keep_alive must be -1 (never unload) or between 0 and {MAX_KEEP_ALIVE_S} "
                f"seconds, not {value}"
            )
        return value

    @field_validator("source")
    @classmethod
    def _source_exists(cls, value: str) -> str:
        check_source(value)
        return value

    @field_validator("structured_outputs", mode="before")
    @classmethod
    def _yaml_off(cls, value: Any) -> Any:
        # YAML 1.1 reads a bare `off` as false (and `on` as true).
        if isinstance(value, bool):
            return "llguidance" if value else "off"
        return value

    @field_validator("tool_call_parser")
    @classmethod
    def _known_tool_parser(cls, value: str | None) -> str | None:
        from vllm_mlx.parsers.tool_calls import tool_call_parser_names

        if value is not None and value not in tool_call_parser_names():
            raise ValueError(
                f"unknown tool_call_parser {value!r}; valid: {', '.join(tool_call_parser_names())}"
            )
        return value

    @field_validator("reasoning_parser")
    @classmethod
    def _known_reasoning_parser(cls, value: str | None) -> str | None:
        from vllm_mlx.parsers.reasoning import reasoning_parser_names

        if value is not None and value not in reasoning_parser_names():
            raise ValueError(
                f"unknown reasoning_parser {value!r}; valid: {', '.join(reasoning_parser_names())}"
            )
        return value

    @model_validator(mode="before")
    @classmethod
    def _vision_task(cls, data: Any) -> Any:
        # A VLM generates text: every generation setting applies to it.
        if isinstance(data, dict) and data.get("task") == "vision":
            return {**data, "task": "generate", "vision": data.get("vision", True)}
        return data

    @model_validator(mode="after")
    def _vision_generates(self) -> ModelSettings:
        if self.vision and self.task != "generate":
            raise LocatedError(
                f"vision applies to generation models; this one has task: {self.task}",
                ("vision",),
            )
        return self

    @model_validator(mode="after")
    def _kv_cache_generates(self) -> ModelSettings:
        if self.kv_cache.bits is not None and self.task != "generate":
            raise LocatedError(
                f"kv_cache.bits applies to generation models; this one has task: {self.task}",
                ("kv_cache", "bits"),
            )
        return self

    @model_validator(mode="after")
    def _speculative_generates(self) -> ModelSettings:
        if self.speculative.method is None:
            return self
        if self.task != "generate":
            raise LocatedError(
                f"speculative applies to generation models; this one has task: {self.task}",
                ("speculative", "method"),
            )
        return self

    @model_validator(mode="after")
    def _adapters_generate(self) -> ModelSettings:
        if self.adapters and self.task != "generate":
            raise LocatedError(
                f"adapters apply to generation models; this one has task: {self.task}",
                ("adapters",),
            )
        return self

    @model_validator(mode="after")
    def _auto_tool_choice_needs_parser(self) -> ModelSettings:
        if self.enable_auto_tool_choice and self.tool_call_parser is None:
            raise ValueError("enable_auto_tool_choice needs tool_call_parser (e.g. `auto`)")
        if self.mcp_tools != "none" and not self.enable_auto_tool_choice:
            raise ValueError(
                f"mcp_tools: {self.mcp_tools} needs enable_auto_tool_choice and a "
                "tool_call_parser (the model's calls must be parsed to reach MCP servers)"
            )
        return self


def warm_texts(model: ModelSettings) -> list[str]:
    """The model's warm prompts as text (files read now)."""
    return [item.prompt() for item in model.warm_prompts]


def loads_at_startup(models: list[ModelSettings], index: int) -> bool:
    """`load` resolved: unset means startup for the first model only."""
    load = models[index].load
    return load == "startup" if load is not None else index == 0
