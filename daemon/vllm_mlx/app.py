"""create_app(state) -> the Litestar application."""

from __future__ import annotations

from typing import Any

from litestar import Litestar, Request, Response
from litestar.datastructures import State
from litestar.exceptions import HTTPException

from vllm_mlx.api.anthropic.routes import make_anthropic_router
from vllm_mlx.api.audio.routes import make_audio_router
from vllm_mlx.api.cache_routes import make_cache_router
from vllm_mlx.api.dashboard import root, root_head, ui_asset, ui_page
from vllm_mlx.api.edge.auth import is_api_path, protocol_of
from vllm_mlx.api.edge.boundary import route_path
from vllm_mlx.api.error_shapes import error_response
from vllm_mlx.api.errors import APIError
from vllm_mlx.api.mcp_routes import make_mcp_router
from vllm_mlx.api.ollama.routes import make_ollama_router
from vllm_mlx.api.openai.routes import make_openai_router
from vllm_mlx.api.ops import health, install_ops, metrics, status
from vllm_mlx.api.rerank.routes import make_rerank_router
from vllm_mlx.api.responses.routes import make_responses_router
from vllm_mlx.api.state import ServerState
from vllm_mlx.api.tokenize import make_tokenize_router
from vllm_mlx.api.usage_routes import make_usage_router


def _plain_error(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    # Outside the routers (unknown paths, wrong methods): a JSON error, never a traceback.
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    detail = exc.detail if isinstance(exc, HTTPException) else "internal server error"
    path = route_path(request.scope["path"], request.scope.get("root_path", ""))
    if status == 404 and is_api_path(path):
        # e.g. /v1/audio/speech: say it is this daemon's gap, not a typo in the model.
        detail = f"{request.method} {path} is not served by this daemon."
    protocol = protocol_of(path, request.headers)
    if protocol != "openai":
        # e.g. GET /v1/messages: the Anthropic SDK reads only its own error shape.
        error = APIError(status, str(detail), kind="http")  # the status picks the type
        return error_response(protocol, error)
    return error_response("openai", APIError(status, str(detail), "invalid_request"))


def create_app(state: ServerState) -> Litestar:
    app = Litestar(
        route_handlers=[
            health,
            metrics,
            status,
            make_openai_router(),
            make_anthropic_router(),
            make_mcp_router(),
            make_tokenize_router(),
            make_rerank_router(),
            make_audio_router(),
            make_responses_router(),
            make_ollama_router(),
            make_cache_router(),
            make_usage_router(),
            root,
            root_head,
            ui_page,
            ui_asset,
        ],
        state=State({"server": state}),
        exception_handlers={Exception: _plain_error},
        logging_config=None,
        openapi_config=None,
        debug=False,
        request_max_body_size=None,  # limits.max_body_mb, checked per request (hot reload)
    )
    install_ops(app, state)  # keys, limits, CORS, HTTP metrics, disconnects: before routing
    return app
