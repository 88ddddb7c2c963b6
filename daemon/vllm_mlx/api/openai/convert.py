"""OpenAI wire <-> neutral engine records."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from vllm_mlx.api.errors import bad_request
from vllm_mlx.api.openai.schema import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    ImagePart,
    NamedToolChoice,
    Tool,
    UsageDict,
)
from vllm_mlx.api.pipeline.canonical import canonical_system
from vllm_mlx.api.pipeline.chat_template import as_token_list
from vllm_mlx.api.pipeline.structured import ForcedTools
from vllm_mlx.api.pipeline.turn import Turn
from vllm_mlx.api.pipeline.vision import UNSUPPORTED, ImageParts, content
from vllm_mlx.engine.constraints import Constraint
from vllm_mlx.engine.types import FinishReason, SamplingParams, Usage
from vllm_mlx.parsers.types import ToolCall, ToolSpec


def _message_content(
    message: ChatMessage, index: int, images: ImageParts | None
) -> str | list[dict[str, Any]] | None:
    """Text, or text and images in order (`images` None: a text model's request)."""
    if message.content is None or isinstance(message.content, str):
        return message.content
    items: list[str | dict[str, Any]] = []
    for position, part in enumerate(message.content):
        if isinstance(part, ImagePart):
            where = f"messages[{index}].content[{position}]"
            if images is None:
                raise bad_request("model does not accept images", where, UNSUPPORTED)
            items.append(images.part(*part.source(where)))
        else:
            items.append(part.text)
    return content(items)


def template_messages(
    request: ChatCompletionRequest, volatile: Sequence[str] = (), images: ImageParts | None = None
) -> list[dict[str, Any]]:
    """Messages as chat templates expect them (HF conventions, tool calls as objects);
    `volatile` (engine.prompt_canonicalization): the system lines left out; `images`:
    where a vision model's request collects its images."""
    out: list[dict[str, Any]] = []
    for index, message in enumerate(request.messages):
        role = "system" if message.role == "developer" else message.role
        body = _message_content(message, index, images) or ""
        if role == "system" and isinstance(body, str):
            body = canonical_system(body, volatile)
        item: dict[str, Any] = {"role": role, "content": body}
        if message.name:
            item["name"] = message.name
        if message.tool_calls:
            item["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {
                        "name": call.function.name,
                        "arguments": _json_or_text(call.function.arguments),
                    },
                }
                for call in message.tool_calls
            ]
        if message.tool_call_id:
            item["tool_call_id"] = message.tool_call_id
        out.append(item)
    return out


def _json_or_text(arguments: str) -> Any:
    # Templates iterate arguments as a mapping (Qwen, Llama); fall back to the raw text.
    try:
        return json.loads(arguments)
    except json.JSONDecodeError:
        return arguments


def template_tools(request: ChatCompletionRequest) -> list[dict[str, Any]] | None:
    tools = offered_tools(request)
    return None if tools is None else [tool.model_dump(exclude_none=True) for tool in tools]


def template_kwargs(request: ChatCompletionRequest, allow_templates: bool) -> dict[str, Any]:
    """chat_template_kwargs, with a client's own template only when the config allows it.

    A template is a program the daemon runs: off by default
    (server.allow_client_chat_templates).
    """
    kwargs = dict(request.chat_template_kwargs or {})
    if request.chat_template is not None:
        kwargs["chat_template"] = request.chat_template
    if "chat_template" in kwargs and not allow_templates:
        param = (
            "chat_template" if request.chat_template is not None
            else "chat_template_kwargs.chat_template"
        )  # fmt: skip
        raise bad_request(
            f"'{param}': client-supplied chat templates are disabled on this server "
            "(server.allow_client_chat_templates)",
            param,
            "client_templates_disabled",
        )
    return kwargs


def completion_prompt_tokens(tokenizer: Any, request: CompletionRequest) -> list[list[int]]:
    """Every prompt of the request as token ids (text is encoded, ids are checked)."""
    prompts = request.prompts()
    vocab_size = len(tokenizer.get_vocab())
    out = []
    for index, prompt in enumerate(prompts):
        where = "prompt" if len(prompts) == 1 else f"prompt[{index}]"
        if isinstance(prompt, str):
            out.append(as_token_list(tokenizer.encode(prompt)))
            continue
        ids = [int(t) for t in prompt]
        if any(t < 0 or t >= vocab_size for t in ids):
            raise bad_request(f"{where} contains token ids outside the vocabulary", where)
        out.append(ids)
    return out


def usage_dict(usage: Usage) -> UsageDict:
    out: UsageDict = {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }
    if usage.predicted is not None:  # a request with a prediction (Predicted Outputs)
        proposed, accepted = usage.predicted
        out["completion_tokens_details"] = {
            "accepted_prediction_tokens": accepted,
            "rejected_prediction_tokens": proposed - accepted,
        }
    return out


def finish_reason(reason: FinishReason) -> str:
    if reason in (FinishReason.LENGTH, FinishReason.TOOL_CALLS):
        return reason.value
    return "stop"


class ChatChunks:
    """Builds the chunks of one streamed chat completion (same id and created)."""

    def __init__(self, request_id: str, model: str) -> None:
        self.base = {
            "id": request_id,
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": model,
        }

    def chunk(
        self,
        delta: dict[str, Any],
        reason: str | None = None,
        index: int = 0,
        logprobs: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        choice = {"index": index, "delta": delta, "finish_reason": reason, "logprobs": logprobs}
        return {**self.base, "choices": [choice]}

    def usage(self, usage: Usage) -> dict[str, Any]:
        return {**self.base, "choices": [], "usage": usage_dict(usage)}


def chat_choice(
    index: int, message: dict[str, Any], reason: str, logprobs: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {"index": index, "message": message, "finish_reason": reason, "logprobs": logprobs}


def chat_response(
    request_id: str, model: str, choices: list[dict[str, Any]], usage: Usage
) -> dict[str, Any]:
    return {
        "id": request_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage_dict(usage),
    }


def completion_chunk(
    request_id: str,
    model: str,
    text: str,
    reason: str | None,
    created: int,
    index: int = 0,
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "id": request_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"index": index, "text": text, "logprobs": logprobs, "finish_reason": reason}],
    }


def offered_tools(request: ChatCompletionRequest) -> list[Tool] | None:
    """The tools the model is shown: none for tool_choice "none", only the named one
    for a named choice, all of them otherwise."""
    if not request.tools or request.tool_choice == "none":
        return None
    if isinstance(request.tool_choice, NamedToolChoice):
        return [t for t in request.tools if t.function.name == request.tool_choice.function.name]
    return list(request.tools)


def tool_specs(tools: list[Tool] | None) -> list[ToolSpec] | None:
    if tools is None:
        return None
    return [ToolSpec(t.function.name, t.function.parameters) for t in tools]


def tool_call_dict(call: ToolCall) -> dict[str, Any]:
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }


def chat_message(content: str, reasoning: str, calls: list[ToolCall]) -> dict[str, Any]:
    """The assistant message; reasoning under both `reasoning` and vLLM's older
    `reasoning_content` name."""
    message: dict[str, Any] = {
        "role": "assistant",
        "content": content if content or not calls else None,
        "refusal": None,
    }
    if reasoning:
        message["reasoning"] = message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = [tool_call_dict(c) for c in calls]
    return message


def reasoning_delta(text: str) -> dict[str, Any]:
    return {"reasoning": text, "reasoning_content": text}


def tool_start_delta(index: int, call_id: str, name: str) -> dict[str, Any]:
    function = {"name": name, "arguments": ""}
    return {
        "tool_calls": [{"index": index, "id": call_id, "type": "function", "function": function}]
    }


def tool_arguments_delta(index: int, fragment: str) -> dict[str, Any]:
    return {"tool_calls": [{"index": index, "function": {"arguments": fragment}}]}


def sampling_from(turn: Turn, body: ChatCompletionRequest | CompletionRequest) -> SamplingParams:
    """The request's sampling fields over the configured defaults; top_p 0 is greedy."""
    greedy = body.top_p == 0
    return turn.sampling(
        temperature=0.0 if greedy else body.temperature,
        top_p=None if greedy else body.top_p,
        top_k=body.top_k,
        min_p=body.min_p,
        seed=body.seed,
        repetition_penalty=body.repetition_penalty,
        presence_penalty=body.presence_penalty,
        frequency_penalty=body.frequency_penalty,
        logit_bias=body.bias_map(),
    )


# --- structured outputs (docs/structured-outputs.md) -------------------------------------


def output_constraint(body: ChatCompletionRequest | CompletionRequest) -> Constraint | None:
    """What response_format or vLLM's extras ask of the output; at most one may be set."""
    found: list[Constraint] = []
    fmt = body.response_format
    if fmt is not None and fmt.type == "json_object":
        found.append(Constraint("json_object", None, "response_format"))
    elif fmt is not None and fmt.type == "json_schema" and fmt.json_schema is not None:
        schema = fmt.json_schema.schema_
        found.append(
            Constraint(
                "json_schema",
                {} if schema is None else schema,
                "response_format.json_schema.schema",
            )
        )
    so = body.structured_outputs
    if so is not None:
        if so.json_ is not None:
            found.append(_json_constraint(so.json_, "structured_outputs.json"))
        elif so.json_object:
            found.append(Constraint("json_object", None, "structured_outputs.json_object"))
        elif so.regex is not None:
            found.append(Constraint("regex", so.regex, "structured_outputs.regex"))
        elif so.choice is not None:
            found.append(Constraint("choice", so.choice, "structured_outputs.choice"))
        elif so.grammar is not None:
            found.append(Constraint("grammar", so.grammar, "structured_outputs.grammar"))
    if body.guided_json is not None:
        found.append(_json_constraint(body.guided_json, "guided_json"))
    for kind, value, param in (
        ("regex", body.guided_regex, "guided_regex"),
        ("choice", body.guided_choice, "guided_choice"),
        ("grammar", body.guided_grammar, "guided_grammar"),
    ):
        if value is not None:
            found.append(Constraint(kind, value, param))  # type: ignore[arg-type]
    if len(found) > 1:
        names = ", ".join(str(c.param) for c in found)
        raise bad_request(f"only one output constraint may be given; got {names}", found[1].param)
    return found[0] if found else None


def _json_constraint(value: Any, param: str) -> Constraint:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise bad_request(f"'{param}' is not valid JSON: {exc}", param) from exc
    if not isinstance(value, dict | bool):
        raise bad_request(f"'{param}' must be a JSON schema (an object)", param)
    return Constraint("json_schema", value, param)


def forced_tools(body: ChatCompletionRequest) -> ForcedTools | None:
    """tool_choice "required" or a named function: the output must be calls."""
    if not body.tools or (
        body.tool_choice not in ("required",) and not isinstance(body.tool_choice, NamedToolChoice)
    ):
        return None
    offered = offered_tools(body) or []
    params = [f"tools[{body.tools.index(tool)}].function.parameters" for tool in offered]
    named = isinstance(body.tool_choice, NamedToolChoice)
    specs = tool_specs(offered) or []
    return ForcedTools(specs, params, named=named, single=body.parallel_tool_calls is False)


def refuse_unsupported(body: ChatCompletionRequest | CompletionRequest) -> None:
    """400s naming the fields this server cannot honour, and why."""
    if isinstance(body, CompletionRequest):
        if body.suffix:
            raise bad_request(
                "suffix is not supported: the model has no fill-in-the-middle support", "suffix"
            )
        return
    if body.audio is not None:
        raise bad_request("audio output is not supported: the model produces text only", "audio")
    if body.modalities and any(m != "text" for m in body.modalities):
        raise bad_request(
            "modalities other than 'text' are not supported: the model produces text only",
            "modalities",
        )
    if body.top_logprobs and not body.logprobs:
        raise bad_request("top_logprobs requires logprobs: true", "top_logprobs")
