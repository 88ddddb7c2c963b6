"""Responses API wire types: the request body, input items, tools and options.

`input` items and `tools` arrive as plain objects and are validated one by one in
convert.py, so an error names its exact place (`input[3].content[0].type`) instead of
pydantic's union branches. Response objects are plain dicts built in stream.py.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

# OpenAI's own bounds on metadata: 16 pairs, keys up to 64 characters, values up to 512.
MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY = 64
MAX_METADATA_VALUE = 512


class _Wire(BaseModel):
    # Clients send fields this server has no use for (and new ones appear often);
    # they are accepted and ignored, as OpenAI-compatible servers do. Types are strict,
    # like the other protocols': "0.5" is not a number, 1 is not true.
    model_config = ConfigDict(extra="ignore", strict=True)


# --- input items -------------------------------------------------------------------


class TextPart(_Wire):
    """input_text / output_text: the text parts of a message."""

    type: Literal["input_text", "output_text"]
    text: str


class RefusalPart(_Wire):
    type: Literal["refusal"]
    refusal: str


class MessageItem(_Wire):
    type: Literal["message"] = "message"
    id: str | None = None
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[dict[str, Any]]


class FunctionCallItem(_Wire):
    type: Literal["function_call"]
    id: str | None = None
    call_id: str = Field(min_length=1, max_length=256)
    name: str = Field(min_length=1, max_length=256)
    namespace: str | None = None
    arguments: str = ""


class FunctionCallOutputItem(_Wire):
    type: Literal["function_call_output"]
    id: str | None = None
    call_id: str = Field(min_length=1, max_length=256)
    output: str | list[dict[str, Any]]


class SummaryText(_Wire):
    type: Literal["summary_text"] = "summary_text"
    text: str


class ReasoningText(_Wire):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


class ReasoningItem(_Wire):
    type: Literal["reasoning"]
    id: str | None = None
    summary: list[SummaryText] = []
    content: list[ReasoningText] | None = None
    encrypted_content: str | None = None


InputItem = MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem

ITEM_MODELS: dict[str, type[InputItem]] = {
    "message": MessageItem,
    "function_call": FunctionCallItem,
    "function_call_output": FunctionCallOutputItem,
    "reasoning": ReasoningItem,
}


# --- tools ---------------------------------------------------------------------------


class FunctionTool(_Wire):
    type: Literal["function"]
    name: str = Field(min_length=1, max_length=128)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NamespaceTool(_Wire):
    """Codex groups related functions (an MCP server's tools) under one name."""

    type: Literal["namespace"]
    name: str = Field(min_length=1, max_length=128)
    description: str | None = None
    tools: list[dict[str, Any]] = Field(min_length=1)


# --- options -------------------------------------------------------------------------


class TextFormat(_Wire):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None
    description: str | None = None


class TextParam(_Wire):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class ReasoningParam(_Wire):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None


class CreateResponseRequest(_Wire):
    model: str = Field(min_length=1)
    input: str | list[dict[str, Any]] | None = None
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: TextParam | None = None
    reasoning: ReasoningParam | None = None
    store: bool | None = None
    stream: bool | None = None
    previous_response_id: str | None = Field(None, min_length=1)
    include: list[str] | None = None
    metadata: dict[str, str] | None = None
    prompt_cache_key: str | None = None
    user: str | None = None
    # false: this request never drafts, on a model with `speculative` on
    # (docs/speculative.md); true or unset: the model's setting; "ngram" or "draft":
    # that method (lookup on a model with a draft model).
    speculative: bool | Literal["ngram", "draft"] | None = None
    safety_identifier: str | None = None
    client_metadata: dict[str, Any] | None = None
    service_tier: str | None = None
    truncation: Literal["auto", "disabled"] | None = None
    background: bool | None = None
    conversation: str | dict[str, Any] | None = None

    @field_validator("metadata")
    @classmethod
    def _metadata_bounds(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is None:
            return None
        if len(value) > MAX_METADATA_PAIRS:
            raise ValueError(f"at most {MAX_METADATA_PAIRS} key-value pairs")
        for key, text in value.items():
            if len(key) > MAX_METADATA_KEY:
                raise ValueError(f"keys are at most {MAX_METADATA_KEY} characters")
            if len(text) > MAX_METADATA_VALUE:
                raise ValueError(f"values are at most {MAX_METADATA_VALUE} characters")
        return value

    @property
    def stores(self) -> bool:
        return self.store is not False  # OpenAI's default is to store
