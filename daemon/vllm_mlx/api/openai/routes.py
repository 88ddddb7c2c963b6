"""OpenAI-compatible routes: /v1/models (api/models.py), /v1/chat/completions,
/v1/completions and /v1/embeddings, with OpenAI's error shape."""

from __future__ import annotations

from litestar import Router

from vllm_mlx.api.error_shapes import openai_error_response
from vllm_mlx.api.models import get_model, list_models, model_action
from vllm_mlx.api.openai.chat import chat_completions
from vllm_mlx.api.openai.completions import completions
from vllm_mlx.api.openai.embeddings import embeddings


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
