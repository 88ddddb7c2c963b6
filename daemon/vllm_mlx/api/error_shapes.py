"""Each protocol's error shape, in one place: one body function per protocol, and the
exception handler every router of that protocol (and the app itself) installs.

The Responses API, /tokenize and the MCP routes answer in OpenAI's shape; the Messages
API in Anthropic's; Ollama's /api/* in its own ({"error": "..."}). The neutral APIError
(api/errors.py) decides status, kind and code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import structlog
from litestar import Request, Response
from litestar.exceptions import HTTPException

from vllm_mlx.api.anthropic.schema import ErrorResponse as AnthropicErrorResponse
from vllm_mlx.api.errors import APIError, to_api_error
from vllm_mlx.api.openai.schema import ErrorResponse as OpenAIErrorResponse

log = structlog.get_logger("vllm_mlx.api.errors")

Protocol = Literal["openai", "anthropic", "ollama"]
Handler = Callable[[Request[Any, Any, Any], Exception], Response[Any]]

OPENAI_ERROR_TYPES = {
    "invalid_request": "invalid_request_error",
    "not_found": "invalid_request_error",
    "authentication": "authentication_error",
    "permission": "invalid_request_error",
    "too_large": "invalid_request_error",
    "rate_limit": "rate_limit_error",
    "timeout": "timeout_error",
    "unavailable": "service_unavailable_error",
    "server_error": "server_error",
}

ANTHROPIC_ERROR_TYPES = {
    "invalid_request": "invalid_request_error",
    "authentication": "authentication_error",
    "permission": "permission_error",
    "not_found": "not_found_error",
    "rate_limit": "rate_limit_error",
    "unavailable": "overloaded_error",
    "overloaded": "overloaded_error",
    "timeout": "api_error",
    "server_error": "api_error",
}

ANTHROPIC_ERROR_TYPES_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def openai_error_body(error: APIError) -> OpenAIErrorResponse:
    return {
        "error": {
            "message": error.message,
            "type": OPENAI_ERROR_TYPES.get(error.kind, "server_error"),
            "param": error.param,
            "code": error.code,
        }
    }


def anthropic_error_type(error: APIError) -> str:
    """The neutral kind decides; a kind this adapter does not know falls back to the status."""
    if error.kind in ANTHROPIC_ERROR_TYPES:
        return ANTHROPIC_ERROR_TYPES[error.kind]
    fallback = "api_error" if error.status >= 500 else "invalid_request_error"
    return ANTHROPIC_ERROR_TYPES_BY_STATUS.get(error.status, fallback)


def anthropic_error_body(error: APIError) -> AnthropicErrorResponse:
    return {
        "type": "error",
        "error": {"type": anthropic_error_type(error), "message": error.message},
    }


def ollama_error_body(error: APIError) -> dict[str, Any]:
    """Ollama's clients read one string; the field, when there is one, goes into it."""
    return {"error": error.message}


def error_body(protocol: Protocol, error: APIError) -> dict[str, Any]:
    """An error body in the protocol's own shape."""
    if protocol == "anthropic":
        return dict(anthropic_error_body(error))
    if protocol == "ollama":
        return ollama_error_body(error)
    return dict(openai_error_body(error))


def http_error(protocol: Protocol, exc: HTTPException) -> APIError:
    """Litestar's own errors (unknown path, wrong method, bad path parameter)."""
    if protocol != "openai":
        return APIError(exc.status_code, str(exc.detail), kind="http")  # type by status
    kind = "invalid_request" if exc.status_code < 500 else "server_error"
    return APIError(exc.status_code, str(exc.detail), kind)


def error_response(protocol: Protocol, error: APIError) -> Response[Any]:
    return Response(error_body(protocol, error), status_code=error.status, headers=error.headers)


def error_handler(protocol: Protocol) -> Handler:
    """The exception handler of a router whose routes answer in `protocol`'s shape."""

    def handle(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
        error = http_error(protocol, exc) if isinstance(exc, HTTPException) else to_api_error(exc)
        if error.status >= 500 and error.status not in (503, 504):
            log.exception("unhandled error", path=request.url.path)
        return error_response(protocol, error)

    return handle


openai_error_response = error_handler("openai")
anthropic_error_response = error_handler("anthropic")
ollama_error_response = error_handler("ollama")
