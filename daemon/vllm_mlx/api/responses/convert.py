"""Responses wire -> the chat template's messages and tools, checked item by item.

Input items (and, with previous_response_id, the stored conversation before them)
become Hugging Face style chat messages: system/developer text joins one leading
system prompt after `instructions`, function_call items become an assistant turn's
tool calls, function_call_output items become `tool` messages, and reasoning items
ride on the next assistant turn as `reasoning_content`, the key templates read.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from vllm_mlx.api.errors import APIError, bad_request, from_validation_error
from vllm_mlx.api.pipeline.canonical import canonical_system
from vllm_mlx.api.pipeline.ids import new_id
from vllm_mlx.api.pipeline.vision import ImageParts, content
from vllm_mlx.api.responses.schema import (
    ITEM_MODELS,
    CreateResponseRequest,
    FunctionCallOutputItem,
    MessageItem,
    ReasoningItem,
    RefusalPart,
    TextPart,
)
from vllm_mlx.engine.constraints import Constraint

BaseModelT = TypeVar("BaseModelT", bound=BaseModel)

ID_PREFIXES = {
    "message": "msg",
    "function_call": "fc",
    "function_call_output": "fco",
    "reasoning": "rs",
}
UNSUPPORTED_PARTS = {"input_image": "images", "input_file": "files", "input_audio": "audio"}
ImageSink = ImageParts | None  # where a vision model's request collects its images


def validated(model: type[BaseModelT], data: Any, where: str) -> BaseModelT:
    """`model` from `data`; a validation error names the field under `where`."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        error = from_validation_error(exc)
        inner = error.param or ""
        path = f"{where}.{inner}" if inner and not inner.startswith("[") else where + inner
        message = error.message.replace(f"'{inner}'", f"'{path}'") if inner else error.message
        if not inner:
            message = f"Invalid value for '{where}': {message}"
        raise bad_request(message, path) from exc


# --- input items ---------------------------------------------------------------------


def input_items(body: CreateResponseRequest, images: bool = False) -> list[dict[str, Any]]:
    """The request's input as checked items in wire form, each with an id (for storage);
    `images`: the model accepts `input_image` parts."""
    if body.input is None or len(body.input) == 0:
        if body.previous_response_id is None:
            raise bad_request("'input' is required and must not be empty", "input")
        return []
    if isinstance(body.input, str):
        item = MessageItem(role="user", content=body.input)
        return [_normalized(item)]
    return [
        _normalized(_item(raw, f"input[{index}]", images)) for index, raw in enumerate(body.input)
    ]


def _item(raw: dict[str, Any], where: str, images: bool) -> Any:
    kind = raw.get("type", "message" if "role" in raw else None)
    if kind == "item_reference":
        raise bad_request(
            f"{where}: item_reference items are not supported; use previous_response_id "
            "or send the items themselves",
            f"{where}.type",
        )
    model = ITEM_MODELS.get(kind) if isinstance(kind, str) else None
    if model is None:
        known = ", ".join(ITEM_MODELS)
        raise bad_request(
            f"{where}: unknown input item type {kind!r}; supported: {known}", f"{where}.type"
        )
    item = validated(model, raw, where)
    if isinstance(item, MessageItem) and isinstance(item.content, list):
        for position, part in enumerate(item.content):
            _part(part, item.role, f"{where}.content[{position}]", images)
    if isinstance(item, FunctionCallOutputItem) and isinstance(item.output, list):
        for position, part in enumerate(item.output):
            _part(part, "user", f"{where}.output[{position}]", images)
    return item


def _part(part: dict[str, Any], role: str, where: str, images: bool) -> str:
    """The text of one content part; anything but text (an assistant refusal, a vision
    model's user image) is a 400."""
    kind = part.get("type")
    if kind == "input_image" and images and role != "assistant":
        return _image_url(part, where)
    if kind in UNSUPPORTED_PARTS:
        raise bad_request(
            f"{where}: model does not accept {UNSUPPORTED_PARTS[kind]}",
            f"{where}.type",
            "unsupported_content",
        )
    if kind == "refusal" and role == "assistant":
        return validated(RefusalPart, part, where).refusal
    if kind not in ("input_text", "output_text"):
        raise bad_request(
            f"{where}: content part type {kind!r} is not valid here; expected input_text "
            "or output_text",
            f"{where}.type",
        )
    return validated(TextPart, part, where).text


def _image_url(part: dict[str, Any], where: str) -> str:
    if part.get("file_id") is not None and part.get("image_url") is None:
        raise bad_request(
            f"{where}: file_id images need a files API, which this server does not have; "
            "send the image as image_url (a data: URL or an http(s) URL)",
            f"{where}.file_id",
            "unsupported_content",
        )
    url = part.get("image_url")
    if not isinstance(url, str) or not url:
        raise bad_request(f"{where}: input_image needs an image_url", f"{where}.image_url")
    return url


def _normalized(item: Any) -> dict[str, Any]:
    """An item as stored and listed by input_items: an id, a status, parts as lists."""
    data: dict[str, Any] = item.model_dump(exclude_none=True, by_alias=True)
    data["id"] = item.id or new_id(ID_PREFIXES[item.type] + "_", 32)
    if isinstance(item, MessageItem):
        parts = item.content
        if isinstance(parts, str):
            kind = "output_text" if item.role == "assistant" else "input_text"
            parts = [{"type": kind, "text": parts}]
        data["content"] = [_stored_part(part, item.role) for part in parts]
    if not isinstance(item, ReasoningItem):
        data["status"] = "completed"
    return data


def _stored_part(part: dict[str, Any], role: str) -> dict[str, Any]:
    if part.get("type") == "input_image":
        detail = part.get("detail") or "auto"
        return {"type": "input_image", "image_url": part["image_url"], "detail": detail}
    if role != "assistant":
        return {"type": "input_text", "text": part["text"]}
    if part["type"] == "refusal":
        return {"type": "refusal", "refusal": part["refusal"]}
    return {"type": "output_text", "text": part["text"], "annotations": [], "logprobs": []}


# --- items -> chat messages ----------------------------------------------------------


@dataclass
class _Conversation:
    system: list[str]
    messages: list[dict[str, Any]] = field(default_factory=list)
    calls: dict[str, str] = field(default_factory=dict)  # call_id -> template tool name
    reasoning: list[str] = field(default_factory=list)  # waits for the next assistant turn

    def assistant(self, *, join: bool) -> dict[str, Any]:
        last = self.messages[-1] if self.messages else None
        if not (join and last is not None and last["role"] == "assistant"):
            last = {"role": "assistant", "content": ""}
            self.messages.append(last)
        if self.reasoning:
            last["reasoning_content"] = last.get("reasoning_content", "") + "".join(self.reasoning)
            self.reasoning = []
        return last


def chat_messages(
    items: list[dict[str, Any]],
    instructions: str | None,
    first_new: int,
    volatile: Sequence[str] = (),
    images: ImageSink = None,
) -> list[dict[str, Any]]:
    """Template messages for the stored history plus the new items (from `first_new` on);
    `volatile` (engine.prompt_canonicalization): the system lines left out."""
    conversation = _Conversation(system=[instructions] if instructions else [])
    for index, item in enumerate(items):
        where = f"input[{index - first_new}]" if index >= first_new else "previous_response"
        _add(conversation, item, where, images)
    messages = conversation.messages
    system = "\n\n".join(text for text in conversation.system if text)
    system = canonical_system(system, volatile)
    if system:
        messages.insert(0, {"role": "system", "content": system})
    return messages


def _parts(
    parts: list[dict[str, Any]], where: str, images: ImageSink
) -> list[str | dict[str, Any]]:
    """Texts, and images as their content parts (`images` None: a text model's history)."""
    out: list[str | dict[str, Any]] = []
    for position, part in enumerate(parts):
        if part.get("type") != "input_image":
            out.append(part.get("text", part.get("refusal", "")))
        elif images is None:
            field = f"{where}.content[{position}].type"
            raise bad_request(
                f"{where}: model does not accept images", field, "unsupported_content"
            )
        else:
            out.append(images.part(part["image_url"], f"{where}.content[{position}].image_url"))
    return out


def _add(conversation: _Conversation, item: dict[str, Any], where: str, images: ImageSink) -> None:
    kind = item["type"]
    if kind == "message":
        parts = _parts(item["content"], where, images)
        text = "".join(p for p in parts if isinstance(p, str))
        if item["role"] in ("system", "developer"):
            conversation.system.append(text)
        elif item["role"] == "user":
            conversation.messages.append({"role": "user", "content": content(parts)})
        else:
            conversation.assistant(join=False)["content"] = text
    elif kind == "function_call":
        name = flat_name(item.get("namespace"), item["name"])
        call = {
            "id": item["call_id"],
            "type": "function",
            "function": {"name": name, "arguments": _json_or_text(item["arguments"])},
        }
        conversation.assistant(join=True).setdefault("tool_calls", []).append(call)
        conversation.calls[item["call_id"]] = name
    elif kind == "function_call_output":
        conversation.messages.append(_tool_message(conversation, item, where, images))
    else:  # reasoning: summaries, or the full text where a client sent it back
        texts = item.get("content") or item.get("summary") or []
        conversation.reasoning.append("".join(part["text"] for part in texts))


def _tool_message(
    conversation: _Conversation, item: dict[str, Any], where: str, images: ImageSink
) -> dict[str, Any]:
    call_id = item["call_id"]
    if call_id not in conversation.calls:
        raise bad_request(
            f"{where}: no function_call with call_id '{call_id}' comes before this "
            "function_call_output",
            f"{where}.call_id",
        )
    output = item["output"]
    body = output if isinstance(output, str) else content(_parts(output, where, images))
    return {
        "role": "tool",
        "tool_call_id": call_id,
        "name": conversation.calls[call_id],
        "content": body,
    }


def flat_name(namespace: str | None, name: str) -> str:
    """The one name a namespaced function has in the prompt (and in the model's calls)."""
    return f"{namespace}.{name}" if namespace else name


def _json_or_text(arguments: str) -> Any:
    # Templates iterate arguments as a mapping (Qwen, Llama); fall back to the raw text.
    try:
        return json.loads(arguments)
    except json.JSONDecodeError:
        return arguments


# --- options -------------------------------------------------------------------------


def template_kwargs(body: CreateResponseRequest) -> dict[str, Any]:
    # Templates with a thinking switch (Qwen3 and kin) read enable_thinking.
    if body.reasoning is not None and body.reasoning.effort is not None:
        return {"enable_thinking": body.reasoning.effort != "none"}
    return {}


def check_unsupported(body: CreateResponseRequest) -> None:
    if body.background:
        raise bad_request("background responses are not supported here", "background")
    if body.conversation is not None:
        raise bad_request(
            "conversations are not supported here; use previous_response_id", "conversation"
        )


def output_constraint(body: CreateResponseRequest) -> Constraint | None:
    """text.format json_object / json_schema as a constraint on the output
    (docs/structured-outputs.md)."""
    fmt = body.text.format if body.text else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return Constraint("json_object", None, "text.format")
    schema = {} if fmt.schema_ is None else fmt.schema_
    return Constraint("json_schema", schema, "text.format.schema")


def previous_not_found(response_id: str) -> APIError:
    return APIError(
        404,
        f"Previous response with id '{response_id}' not found.",
        "not_found",
        "previous_response_id",
        "previous_response_not_found",
    )


def response_not_found(response_id: str) -> APIError:
    return APIError(
        404, f"No response found with id '{response_id}'.", "not_found", None, "not_found"
    )
