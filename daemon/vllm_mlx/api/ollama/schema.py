"""Ollama's wire types: the request bodies of /api/* (Ollama's docs/api.md and OpenAPI).

Unknown fields are accepted and ignored, as Ollama does; known fields are typed so a
wrong type is a 400 naming the field. `options` keeps every key (Modelfile parameters):
api/ollama/convert.py maps the ones we honour and logs the rest once per request.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool

ThinkLevel = Literal["low", "medium", "high", "max"]


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")


class Options(BaseModel):
    """Modelfile parameters; Ollama accepts any key, so does this."""

    model_config = ConfigDict(extra="allow")

    seed: int | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    stop: str | list[str] | None = None
    num_ctx: int | None = None
    num_predict: int | None = None
    repeat_penalty: float | None = None
    repeat_last_n: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None


class ToolCallFunction(_Request):
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class ToolCall(_Request):
    function: ToolCallFunction


class ChatMessage(_Request):
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    thinking: str | None = None
    images: list[str] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_name: str | None = None


class FunctionDefinition(_Request):
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] = Field(default_factory=dict)


class ToolDefinition(_Request):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class _Generation(_Request):
    """What /api/chat and /api/generate share."""

    model: str = Field(min_length=1)
    format: Literal["json"] | dict[str, Any] | None = Field(None, union_mode="left_to_right")
    options: Options | None = None
    stream: StrictBool = True  # Ollama streams unless told not to (Go: no coercion)
    think: bool | ThinkLevel | None = Field(None, union_mode="left_to_right")
    keep_alive: float | str | None = Field(None, union_mode="left_to_right")
    images: list[str] | None = None
    logprobs: bool | None = None


class ChatRequest(_Generation):
    messages: list[ChatMessage] = Field(default_factory=list)
    tools: list[ToolDefinition] | None = None


class GenerateRequest(_Generation):
    prompt: str = ""
    suffix: str | None = None
    system: str | None = None
    template: str | None = None
    raw: StrictBool = False
    context: list[int] | None = None  # deprecated by Ollama: accepted and ignored


class EmbedRequest(_Request):
    model: str = Field(min_length=1)
    input: str | list[str]
    truncate: StrictBool = True
    dimensions: int | None = Field(None, ge=1)
    keep_alive: float | str | None = Field(None, union_mode="left_to_right")
    options: Options | None = None


class LegacyEmbeddingsRequest(_Request):
    """POST /api/embeddings (superseded by /api/embed): one prompt, one vector."""

    model: str = Field(min_length=1)
    prompt: str
    keep_alive: float | str | None = Field(None, union_mode="left_to_right")
    options: Options | None = None


class ModelRequest(_Request):
    """/api/show and /api/pull: a model by name."""

    model: str | None = None
    name: str | None = None  # older clients send `name`
    verbose: bool = False
    stream: StrictBool = True  # /api/pull streams its progress unless told not to

    def model_name(self) -> str:
        name = self.model or self.name
        if not name:
            raise ValueError("'model' is a required property")
        return name
