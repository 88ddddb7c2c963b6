"""Anthropic Messages wire types: request bodies (validated) and response shapes.

Only what the Messages API defines lives here; turning these into engine requests and
engine events into responses is convert.py's and stream.py's job.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypedDict

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

MAX_STOP_SEQUENCES = 16


class CacheControl(BaseModel):
    """A prompt-caching breakpoint. Our prefix cache needs no breakpoints (every prompt's
    blocks are cached), so it is only checked, as the API checks it: an object whose
    `type` is "ephemeral", `ttl` "5m" or "1h"."""

    model_config = ConfigDict(extra="ignore", strict=True)
    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] | None = None


class _Wire(BaseModel):
    # Clients send fields we do not use (citations, service_tier...); they are accepted
    # and ignored, as the hosted API ignores unknown hints. Strict: types as the API
    # checks them (`"stream": "yes"` is a 400). `cache_control` may sit on any block,
    # tool, or the request itself: checked here once for all of them.
    model_config = ConfigDict(extra="ignore", strict=True)
    cache_control: CacheControl | None = None


class TextBlock(_Wire):
    type: Literal["text"]
    text: str = Field(min_length=1)  # the API refuses empty text blocks


class ImageBlock(_Wire):
    type: Literal["image"]
    source: dict[str, Any] | None = None


class DocumentBlock(_Wire):
    type: Literal["document"]


class ToolUseBlock(_Wire):
    type: Literal["tool_use"]
    id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    input: dict[str, Any] = Field(default_factory=dict)


def _as_blocks(value: Any) -> Any:
    """A string is shorthand for one text block.

    Validating one shape (a list) instead of a ``str | list`` union keeps error
    messages about the block that is wrong, not about "not a valid string".
    """
    return [{"type": "text", "text": value}] if isinstance(value, str) else value


def _as_optional_blocks(value: Any) -> Any:
    """As _as_blocks, but "" is no blocks (an empty system prompt or tool result)."""
    return [] if value == "" else _as_blocks(value)


ToolResultContent = Annotated[TextBlock | ImageBlock, Field(discriminator="type")]


class ToolResultBlock(_Wire):
    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1)
    content: Annotated[list[ToolResultContent], BeforeValidator(_as_optional_blocks)] = Field(
        default_factory=list
    )
    is_error: bool | None = None


class McpToolUseBlock(_Wire):
    """A call Anthropic's MCP connector ran: read as a tool_use."""

    type: Literal["mcp_tool_use"]
    id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    server_name: str | None = None
    input: dict[str, Any] = Field(default_factory=dict)


class McpToolResultBlock(_Wire):
    """The result of a call the server ran (`mcp_tools: execute` streams these), in the
    assistant message right after its tool_use."""

    type: Literal["mcp_tool_result"]
    tool_use_id: str = Field(min_length=1)
    content: Annotated[list[ToolResultContent], BeforeValidator(_as_optional_blocks)] = Field(
        default_factory=list
    )
    is_error: bool | None = None


class ThinkingBlock(_Wire):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(_Wire):
    type: Literal["redacted_thinking"]
    data: str = ""


InputBlock = Annotated[
    TextBlock
    | ImageBlock
    | DocumentBlock
    | ToolUseBlock
    | ToolResultBlock
    | McpToolUseBlock
    | McpToolResultBlock
    | ThinkingBlock
    | RedactedThinkingBlock,
    Field(discriminator="type"),
]


class InputMessage(_Wire):
    # "system" between turns: sent by Claude Code; joined into the system prompt.
    role: Literal["user", "assistant", "system"]
    content: Annotated[list[InputBlock], BeforeValidator(_as_optional_blocks)]


class Tool(_Wire):
    name: str = Field(min_length=1, max_length=128)
    description: str | None = None
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})
    # Client tools have no type or "custom"; anything else is a hosted server tool.
    type: str | None = None


class ToolChoice(_Wire):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None

    @model_validator(mode="after")
    def _name_for_tool(self) -> ToolChoice:
        if self.type == "tool" and not self.name:
            raise ValueError("tool_choice of type 'tool' needs the 'name' of a tool")
        return self


class ThinkingConfig(_Wire):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = Field(None, ge=0)


class PromptFields(_Wire):
    """What shapes the prompt: shared by messages and count_tokens."""

    model: str = Field(min_length=1)
    messages: list[InputMessage]
    system: Annotated[list[TextBlock], BeforeValidator(_as_optional_blocks)] = Field(
        default_factory=list
    )
    tools: list[Tool] | None = None  # absent only: `null` is a 400, as the API has it
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None

    @field_validator("tools", mode="before")
    @classmethod
    def _tools_not_null(cls, value: Any) -> Any:
        # Runs only for a value the client sent (an absent field keeps its default).
        if value is None:
            raise ValueError("tools must be an array of tools when given (not null)")
        return value

    @field_validator("messages")
    @classmethod
    def _not_empty(cls, value: list[InputMessage]) -> list[InputMessage]:
        if not value:
            raise ValueError("at least one message is required")
        for index, message in enumerate(value):
            final_assistant = index == len(value) - 1 and message.role == "assistant"
            if not message.content and not final_assistant:
                # The API's own rule (and words): an empty final assistant turn is a
                # prefill of nothing, any other empty turn is a mistake.
                raise ValueError(
                    "all messages must have non-empty content except for the optional "
                    f"final assistant message (messages[{index}] is empty)"
                )
        return value


class CountTokensRequest(PromptFields):
    pass


class JsonOutputFormat(_Wire):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(_Wire):
    format: JsonOutputFormat | None = None
    effort: str | None = None  # accepted, unused


class MessagesRequest(PromptFields):
    max_tokens: int = Field(ge=1)
    stream: bool = False
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)
    stop_sequences: list[str] | None = Field(None, max_length=MAX_STOP_SEQUENCES)
    metadata: dict[str, Any] | None = None  # accepted, unused (user_id for abuse tracking)
    # Structured outputs: output_config.format (current SDKs) or the older beta field.
    output_config: OutputConfig | None = None
    output_format: JsonOutputFormat | None = None
    # false: this request never drafts, on a model with `speculative` on
    # (docs/speculative.md); true or unset: the model's setting; "ngram" or "draft":
    # that method (lookup on a model with a draft model).
    speculative: bool | Literal["ngram", "draft"] | None = None

    @field_validator("temperature", "top_p", "top_k", mode="before")
    @classmethod
    def _no_null(cls, value: Any) -> Any:
        # Absent means the default; the API answers an explicit null with 400.
        if value is None:
            raise ValueError("must be a number, not null (leave the field out for the default)")
        return value

    def stop_tuple(self) -> tuple[str, ...]:
        return tuple(s for s in self.stop_sequences or () if s)


# --- responses -----------------------------------------------------------------------


class UsageDict(TypedDict):
    """As Anthropic counts: input + cache read + cache creation = the whole prompt."""

    input_tokens: int
    output_tokens: int
    cache_read_input_tokens: int
    cache_creation_input_tokens: int


class ErrorDetail(TypedDict):
    type: str
    message: str


class ErrorResponse(TypedDict):
    type: Literal["error"]
    error: ErrorDetail


class ModelInfo(TypedDict):
    type: Literal["model"]
    id: str
    display_name: str
    created_at: str  # RFC 3339
    lifecycle: Literal["active"]
    max_input_tokens: int | None


class ModelList(TypedDict):
    data: list[ModelInfo]
    has_more: bool
    first_id: str | None
    last_id: str | None
