"""Ollama wire <-> neutral records: model names, messages, options, formats, times.

Ollama names models `name:tag` and `:latest` is the default tag, so `default:latest`
and `default` are the same model here; other tags name no model of ours. Options are
Modelfile parameters: the sampling ones map onto SamplingParams, `num_predict` onto
max_tokens, `num_ctx` is checked against the model's context; the rest are accepted and
logged once per request, as Ollama ignores what a runner does not use.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import structlog

from vllm_mlx.api.errors import bad_request
from vllm_mlx.api.ollama.schema import ChatMessage, ChatRequest, Options, ToolDefinition
from vllm_mlx.api.pipeline.canonical import canonical_system
from vllm_mlx.api.pipeline.turn import Turn
from vllm_mlx.engine.constraints import Constraint
from vllm_mlx.engine.types import FinishReason, SamplingParams
from vllm_mlx.parsers.types import ToolSpec

log = structlog.get_logger("vllm_mlx.api.ollama")

LATEST = ":latest"


def model_id(name: str) -> str:
    """Our model id for an Ollama name: `:latest` is the default tag."""
    return name.removesuffix(LATEST) if name.endswith(LATEST) else name


def listed_name(model_id: str) -> str:
    """How /api/tags and /api/ps name a model: with its tag, as Ollama clients expect."""
    return model_id if ":" in model_id.rsplit("/", 1)[-1] else model_id + LATEST


def digest(text: str) -> str:
    """A stable sha256 hex digest standing for a model (Ollama's manifest digest)."""
    return hashlib.sha256(text.encode()).hexdigest()


def timestamp(seconds: float | None = None) -> str:
    """RFC 3339 with nanoseconds' precision cut to microseconds, as Ollama writes it."""
    moment = datetime.fromtimestamp(seconds, UTC) if seconds is not None else datetime.now(UTC)
    return moment.isoformat().replace("+00:00", "Z")


def done_reason(reason: FinishReason) -> str:
    return "length" if reason is FinishReason.LENGTH else "stop"


# --- options ---------------------------------------------------------------------------


def sampling(turn: Turn, options: Options | None) -> SamplingParams:
    o = options or Options()
    # Ollama's other options (mirostat, num_gpu, num_thread, ...) tune its own runner.
    ignored = sorted(o.model_extra or {})
    if ignored:
        log.debug("ollama options ignored", options=ignored)
    window = _penalty_window(o.repeat_last_n)
    off = window == 0  # Ollama: 0 turns the penalties off (1.0 is no repetition penalty)
    return turn.sampling(
        temperature=o.temperature,
        top_p=o.top_p,
        top_k=o.top_k,
        min_p=o.min_p,
        seed=o.seed,
        repetition_penalty=1.0 if off else o.repeat_penalty,
        presence_penalty=0.0 if off else o.presence_penalty,
        frequency_penalty=0.0 if off else o.frequency_penalty,
        penalty_window=window or None,
    )


def _penalty_window(repeat_last_n: int | None) -> int | None:
    """repeat_last_n as Ollama reads it: the last n tokens the penalties see, 0 none,
    -1 all (here: all the generated ones); None when not given."""
    if repeat_last_n is None or repeat_last_n == -1:
        return None
    if repeat_last_n < -1:
        raise bad_request(
            "repeat_last_n must be -1 (all), 0 (off) or a positive number", "repeat_last_n"
        )
    return repeat_last_n


def max_tokens(turn: Turn, options: Options | None) -> int | None:
    """num_predict (-1, or any negative: until the limit) after num_ctx is checked."""
    o = options or Options()
    context = turn.engine.context_length
    if o.num_ctx is not None and not 0 < o.num_ctx <= context:
        raise bad_request(
            f"options.num_ctx is {o.num_ctx}; model '{turn.model_id}' takes 1 to {context} tokens",
            "options.num_ctx",
        )
    if o.num_predict is None or o.num_predict < 0:
        return None
    if o.num_predict == 0:
        raise bad_request(
            "options.num_predict must be positive (or -1: no limit)", "options.num_predict"
        )
    return o.num_predict


def stop(options: Options | None) -> tuple[str, ...]:
    value = (options or Options()).stop
    if value is None:
        return ()
    return (value,) if isinstance(value, str) else tuple(value)


def output_constraint(fmt: str | dict[str, Any] | None) -> Constraint | None:
    """`format`: "json" (any JSON object) or a JSON schema, enforced token by token."""
    if fmt is None or fmt == "":
        return None
    if fmt == "json":
        return Constraint("json_object", None, "format")
    return Constraint("json_schema", fmt, "format")


def template_kwargs(turn: Turn, think: bool | str | None) -> dict[str, Any]:
    """`think` as the chat template's switch (Qwen3's enable_thinking) and effort."""
    if think is None:
        return {}
    reasoning = turn.model is not None and turn.model.reasoning_parser is not None
    if think is not False and not reasoning:
        raise bad_request(f'"{turn.model_id}" does not support thinking', "think")
    kwargs: dict[str, Any] = {"enable_thinking": think is not False}
    if isinstance(think, str):
        kwargs["reasoning_effort"] = think
    return kwargs


# --- chat messages and tools -----------------------------------------------------------


def refuse_images(images: list[str] | None, param: str) -> None:
    if images:
        raise bad_request(
            f"'{param}': this daemon serves no vision model yet, so images cannot be read",
            param,
            "images_unsupported",
        )


def template_messages(body: ChatRequest, volatile: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Hugging Face chat messages: tool calls with object arguments, tool results named;
    `volatile` (engine.prompt_canonicalization): the system lines left out."""
    out = []
    for index, message in enumerate(body.messages):
        refuse_images(message.images, f"messages[{index}].images")
        out.append(_template_message(message, volatile))
    return out


def _template_message(message: ChatMessage, volatile: Sequence[str]) -> dict[str, Any]:
    content = message.content
    if message.role == "system":
        content = canonical_system(content, volatile)
    item: dict[str, Any] = {"role": message.role, "content": content}
    if message.tool_calls:
        item["tool_calls"] = [
            {"type": "function", "function": call.function.model_dump()}
            for call in message.tool_calls
        ]
    if message.role == "tool" and message.tool_name:
        item["name"] = message.tool_name
    return item


def template_tools(tools: list[ToolDefinition] | None) -> list[dict[str, Any]] | None:
    if not tools:
        return None
    return [tool.model_dump(exclude_none=True) for tool in tools]


def check_tools(turn: Turn, tools: list[ToolDefinition] | None) -> None:
    """Tools on a model that cannot parse calls: a 400, as Ollama answers."""
    model = turn.model
    if tools and not (model and model.enable_auto_tool_choice and model.tool_call_parser):
        raise bad_request(f'"{turn.model_id}" does not support tools', "tools")


def tool_specs(tools: list[ToolDefinition] | None) -> list[ToolSpec] | None:
    if not tools:
        return None
    return [ToolSpec(t.function.name, t.function.parameters) for t in tools]
