"""OpenAI wire types: request bodies (validated) and response shapes (TypedDicts)."""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

MAX_STOP_SEQUENCES = 16
MAX_TOKEN_ID_DIGITS = 9


class _Request(BaseModel):
    # Clients send fields we do not use (user, store, metadata, service_tier...);
    # they are accepted and ignored, as OpenAI-compatible servers do. Strict: types as
    # the API checks them (`"stream": "yes"` or `"max_tokens": "5"` is a 400, not a guess).
    model_config = ConfigDict(extra="ignore", strict=True)


class StreamOptions(_Request):
    include_usage: bool | None = None


class TextPart(_Request):
    type: Literal["text"]
    text: str


class ImageURL(_Request):
    url: str
    detail: Literal["auto", "low", "high"] | None = None  # accepted; tiles are the model's


class ImagePart(_Request):
    """`image_url` (OpenAI), and the `input_image` / `image` spellings other clients send
    (`image_url` or `image` as the URL string)."""

    type: Literal["image_url", "input_image", "image"]
    image_url: ImageURL | str | None = None
    image: str | None = None
    detail: Literal["auto", "low", "high"] | None = None

    def source(self, where: str) -> tuple[str, str]:
        """(the URL, its field path) of this part; `where` is the part's own path."""
        if isinstance(self.image_url, ImageURL):
            return self.image_url.url, f"{where}.image_url.url"
        if self.image_url is not None:
            return self.image_url, f"{where}.image_url"
        return self.image or "", f"{where}.image"


class ToolCallFunction(_Request):
    name: str
    arguments: str = "{}"


class MessageToolCall(_Request):
    id: str
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatMessage(_Request):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart | ImagePart] | None = None
    name: str | None = None
    tool_calls: list[MessageToolCall] | None = None
    tool_call_id: str | None = None


class FunctionDefinition(_Request):
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Request):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedToolChoiceFunction(_Request):
    name: str


class NamedToolChoice(_Request):
    type: Literal["function"] = "function"
    function: NamedToolChoiceFunction


class JsonSchemaSpec(_Request):
    name: str = Field("response", min_length=1, max_length=64)
    description: str | None = None
    schema_: dict[str, Any] | bool | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Request):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaSpec | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("type 'json_schema' needs a 'json_schema' object")
        return self


class StructuredOutputs(_Request):
    """vLLM's request extra: exactly one of these."""

    json_: Any = Field(None, alias="json")  # a schema object, or its JSON text
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> StructuredOutputs:
        given = [k for k in ("json_", "regex", "choice", "grammar") if getattr(self, k) is not None]
        given += ["json_object"] if self.json_object else []
        if len(given) != 1:
            raise ValueError("give exactly one of json, regex, choice, grammar, json_object")
        return self


class _SamplingFields(_Request):
    model: str = Field(min_length=1)
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1, description="0 means greedy")
    top_k: int | None = Field(None, ge=0)
    min_p: float | None = Field(None, ge=0, le=1)
    seed: int | None = None
    stop: str | list[str] | None = None
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    repetition_penalty: float | None = Field(None, gt=0, le=10)
    logit_bias: dict[str, float] | None = None
    n: int | None = Field(None, ge=1, le=128, description="limits.max_n caps it further")
    max_tokens: int | None = Field(None, ge=1)
    timeout: float | None = Field(
        None, gt=0, description="seconds; may lower server.timeout, never raise it"
    )
    response_format: ResponseFormat | None = None
    # vLLM's structured-output extras, so clients written for vLLM work unchanged.
    structured_outputs: StructuredOutputs | None = None
    guided_json: Any = None  # a schema object, or its JSON text
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    # vLLM's extra: which distribution logprobs report (docs/api.md).
    logprobs_mode: Literal["processed_logprobs", "raw_logprobs"] | None = None
    # false: this request never drafts, on a model with `speculative` on
    # (docs/speculative.md); true or unset: the model's setting; "ngram" or "draft":
    # that method (lookup on a model with a draft model).
    speculative: bool | Literal["ngram", "draft"] | None = None
    # vLLM's and llama.cpp's extra: generate max_tokens tokens whatever the model's
    # end-of-sequence (benchmark clients ask for fixed-length replies).
    ignore_eos: bool | None = None

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, list) and len(value) > MAX_STOP_SEQUENCES:
            raise ValueError(f"at most {MAX_STOP_SEQUENCES} stop sequences are allowed")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _bias(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        for token, bias in (value or {}).items():
            # isdigit() alone takes "²" and other digits int() refuses; ids are short.
            if not (token.isascii() and token.isdigit() and len(token) <= MAX_TOKEN_ID_DIGITS):
                raise ValueError(f"keys must be token ids, got {token!r}")
            if not -100 <= bias <= 100:
                raise ValueError(f"bias for token {token} must be between -100 and 100")
        return value

    def stop_tuple(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    def bias_map(self) -> dict[int, float] | None:
        return {int(k): v for k, v in self.logit_bias.items()} if self.logit_bias else None


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    chat_template: str | None = Field(
        None, description="vLLM's field; refused unless server.allow_client_chat_templates"
    )
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    # Fields for outputs this server cannot produce; refused by name (see unsupported).
    audio: dict[str, Any] | None = None
    modalities: list[str] | None = None
    prediction: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _named_tool_exists(self) -> ChatCompletionRequest:
        if isinstance(self.tool_choice, NamedToolChoice):
            names = {t.function.name for t in self.tools or []}
            if self.tool_choice.function.name not in names:
                raise ValueError(
                    f"tool_choice names function {self.tool_choice.function.name!r}, "
                    f"which is not among the request's tools"
                )
        return self

    def wanted_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(_SamplingFields):
    # Required, as the spec has it (a body without it is a mistake, not a request to
    # generate from nothing); `null` is the spec's default, "<|endoftext|>".
    prompt: str | list[str] | list[int] | list[list[int]] | None = Field(
        description="text, token ids, or several prompts: strings or token-id arrays",
    )
    max_tokens: int | None = Field(None, ge=0, description="0 with echo scores the prompt")
    echo: bool | None = None
    logprobs: int | None = Field(None, ge=0, le=5)
    suffix: str | None = None
    best_of: int | None = Field(None, ge=0, le=20)

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt_shape(cls, value: Any) -> Any:
        # Checked before the union, whose own error names only its first member
        # ("prompt.str: Input should be a valid string").
        def token(item: Any) -> bool:
            return isinstance(item, int) and not isinstance(item, bool)

        def ids(item: Any) -> bool:
            return isinstance(item, list) and all(token(t) for t in item)

        if value is None or isinstance(value, str) or ids(value):
            return value
        if isinstance(value, list) and (
            all(isinstance(v, str) for v in value) or all(ids(v) for v in value)
        ):
            return value
        raise ValueError(
            "prompt must be a string, an array of token ids, an array of strings or an "
            "array of token-id arrays"
        )

    @field_validator("prompt")
    @classmethod
    def _no_empty_prompt(
        cls, value: str | list[str] | list[int] | list[list[int]] | None
    ) -> str | list[str] | list[int] | list[list[int]]:
        if value is None:
            return "<|endoftext|>"  # the spec's default
        if isinstance(value, list):
            if not value:
                raise ValueError("the prompt is empty")
            for index, item in enumerate(value):
                if isinstance(item, str | list) and not item:
                    raise ValueError(f"prompt {index} is empty")
        return value

    def prompts(self) -> list[str | list[int]]:
        """Each prompt of the request: one string or one array of token ids."""
        prompt = self.prompt
        if prompt is None or isinstance(prompt, str):
            return [prompt or "<|endoftext|>"]
        if isinstance(prompt[0], int):
            return [prompt]
        return list(prompt)


# --- responses -----------------------------------------------------------------------


class PromptTokensDetails(TypedDict):
    cached_tokens: int  # prompt tokens the prefix cache supplied


class CompletionTokensDetails(TypedDict):
    accepted_prediction_tokens: int  # Predicted Outputs: proposed tokens in the reply
    rejected_prediction_tokens: int  # and not in it


class UsageDict(TypedDict):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails
    completion_tokens_details: NotRequired[CompletionTokensDetails]


class ErrorBody(TypedDict):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(TypedDict):
    error: ErrorBody


class ModelCard(TypedDict):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    task: NotRequired[str]  # ours: generate | embed | rerank


# --- vLLM's /tokenize and /detokenize ------------------------------------------------


class TokenizeRequest(_Request):
    """Either `prompt` (text) or `messages` (rendered with the chat template)."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    tools: list[Tool] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_special_tokens: bool | None = None  # default: True for a prompt, False for messages
    add_generation_prompt: bool | None = None  # default True
    continue_final_message: bool | None = None
    return_token_strs: bool | None = None

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("send exactly one of 'prompt' and 'messages'")
        if self.messages is not None and not self.messages:
            raise ValueError("messages is empty")
        return self


class DetokenizeRequest(_Request):
    model: str | None = None
    tokens: list[int] = Field(max_length=1_000_000)
