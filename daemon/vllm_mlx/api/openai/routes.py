"""OpenAI-compatible routes: /v1/models, /v1/chat/completions, /v1/completions.

POST /v1/embeddings lives in embeddings.py.
"""

from __future__ import annotations

from typing import Any

import structlog
from litestar import Request, Response, Router, get
from litestar.exceptions import HTTPException
from litestar.params import FromPath

from vllm_mlx.api.anthropic import convert as anthropic_convert
from vllm_mlx.api.edge.body import server_state
from vllm_mlx.api.errors import APIError, model_not_found, to_api_error
from vllm_mlx.api.models import model_action
from vllm_mlx.api.openai import convert
from vllm_mlx.api.openai.chat import chat_completions
from vllm_mlx.api.openai.completions import completions
from vllm_mlx.api.openai.embeddings import embeddings
from vllm_mlx.api.openai.schema import ModelCard
from vllm_mlx.api.state import ServerState

log = structlog.get_logger(__name__)


def openai_error_response(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    if isinstance(exc, HTTPException):
        error = APIError(
            exc.status_code,
            str(exc.detail),
            "invalid_request" if exc.status_code < 500 else "server_error",
        )
    else:
        error = to_api_error(exc)
    if error.status >= 500 and error.status not in (503, 504):
        log.exception("unhandled error", path=request.url.path)
    return Response(convert.error_body(error), status_code=error.status, headers=error.headers)


def _model_card(model_id: str, created: int) -> ModelCard:
    return {"id": model_id, "object": "model", "created": created, "owned_by": "vllm-mlx"}


def model_cards(state: ServerState) -> list[ModelCard]:
    cards = []
    for entry in state.registry.entries():
        name = entry.settings.name
        cards.append(_model_card(name, entry.created))
        cards.extend(_model_card(a, entry.created) for a in state.registry.aliases_of(name))
    return cards


@get("/models")
async def list_models(request: Request[Any, Any, Any]) -> Any:
    state = server_state(request)
    if anthropic_convert.wants_anthropic(request.headers):  # Anthropic SDK, Claude Code
        return anthropic_convert.model_list(state)
    return {"object": "list", "data": model_cards(state)}


@get("/models/{model_id:path}")
async def get_model(request: Request[Any, Any, Any], model_id: FromPath[str]) -> Any:
    model_id = model_id.lstrip("/")
    state = server_state(request)
    if anthropic_convert.wants_anthropic(request.headers):
        info = anthropic_convert.find_model(state, model_id)
        if info is not None:
            return info
        body = anthropic_convert.error_body(model_not_found(model_id))
        return Response(body, status_code=404)
    for card in model_cards(state):
        if card["id"] == model_id:
            return card
    raise model_not_found(model_id)


def make_openai_router() -> Router:
    return Router(
        path="/v1",
        route_handlers=[
            list_models,
            get_model,
            model_action,
            chat_completions,
            completions,
            embeddings,
        ],
        exception_handlers={Exception: openai_error_response},
    )
