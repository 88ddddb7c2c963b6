"""OpenAI wire types of POST /v1/embeddings (request validated, response as TypedDicts)."""

from __future__ import annotations

from typing import Any, Literal, TypedDict

from pydantic import BaseModel, ConfigDict, Field


class EmbeddingRequest(BaseModel):
    # Fields we do not use are accepted and ignored, as on the other OpenAI routes.
    model_config = ConfigDict(extra="ignore")

    model: str
    # A string, a list of strings, a list of token ids or a list of token-id lists:
    # checked by hand (api/pipeline/embedding.py) so each error names the bad element.
    input: Any = Field(...)
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)
    user: str | None = None
    # Our extension: cut inputs over the model's maximum instead of refusing them.
    truncate: bool = False


class EmbeddingItem(TypedDict):
    object: Literal["embedding"]
    index: int
    embedding: list[float] | str


class EmbeddingUsage(TypedDict):
    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(TypedDict):
    object: Literal["list"]
    data: list[EmbeddingItem]
    model: str
    usage: EmbeddingUsage
