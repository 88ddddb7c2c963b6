"""Wire types of the rerank routes: Jina's and Cohere's /rerank bodies, vLLM's /score.

Field types are checked by pydantic (a wrong type is a 400 naming the field); emptiness
and the document bound are checked in api/rerank/scoring.py so each error names the
offending item.
"""

from __future__ import annotations

from typing import Literal, NotRequired, TypedDict

from pydantic import BaseModel, ConfigDict, StrictBool, StrictInt, StrictStr


class RerankDocument(BaseModel):
    # Cohere v1 and Jina accept `{"text": ...}`; other keys (titles, ids) ride along.
    model_config = ConfigDict(extra="allow")

    text: StrictStr


class RerankRequest(BaseModel):
    # Fields we do not use (Cohere's rank_fields, max_chunks_per_doc) are ignored.
    model_config = ConfigDict(extra="ignore")

    model: StrictStr
    query: StrictStr
    documents: list[StrictStr | RerankDocument]
    top_n: StrictInt | None = None
    # None: the route's default (Jina and vLLM return documents, Cohere v2 does not).
    return_documents: StrictBool | None = None


class ScoreRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: StrictStr
    text_1: StrictStr | list[StrictStr]
    text_2: StrictStr | list[StrictStr]


class DocumentText(TypedDict):
    text: str


class RerankResult(TypedDict):
    index: int
    relevance_score: float
    document: NotRequired[DocumentText]


class RerankUsage(TypedDict):
    prompt_tokens: int
    total_tokens: int


class RerankTokens(TypedDict):
    input_tokens: int
    output_tokens: int


class RerankMeta(TypedDict):
    # Cohere's `meta`: its SDK reads the token counts here.
    api_version: dict[str, str]
    billed_units: dict[str, int]
    tokens: RerankTokens


class RerankResponse(TypedDict):
    id: str
    model: str
    results: list[RerankResult]
    usage: RerankUsage
    meta: RerankMeta


class ScoreItem(TypedDict):
    index: int
    object: Literal["score"]
    score: float


class ScoreResponse(TypedDict):
    id: str
    object: Literal["list"]
    created: int
    model: str
    data: list[ScoreItem]
    usage: RerankUsage
