"""The status page (`GET /ui`) and the root every client probes (`GET /`, `HEAD /`).

The page is three static files from the package (vllm_mlx/ui): no data is in them, so
they are served without a key; the page reads `/v1/status` and calls the API with the
key a person types in, like any client. A strict Content-Security-Policy keeps any
text the daemon reports (a model's error, a client's bad model name) from ever
running as script: the page only sets it as text, and only its own script may run.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any

from litestar import Request, Response, get, head
from litestar.params import FromPath
from litestar.response import Redirect

from vllm_mlx.api.error_shapes import error_response
from vllm_mlx.api.errors import APIError
from vllm_mlx.api.state import server_state

UI_PATH = "/ui"
ASSETS = {
    "index.html": "text/html; charset=utf-8",
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",  # a daemon upgrade serves its own page at once
}
OPEN_UI_PATHS = frozenset({UI_PATH, *(f"{UI_PATH}/{name}" for name in ASSETS)})


@cache
def _asset(name: str) -> bytes:
    return resources.files("vllm_mlx.ui").joinpath(name).read_bytes()


def _serve(request: Request[Any, Any, Any], name: str) -> Response[Any]:
    # Outside the protocol routers: errors are answered here, in OpenAI's shape.
    if not server_state(request).settings.server.dashboard:
        off = APIError(404, "the status page is off (server.dashboard: false)", "not_found")
        return error_response("openai", off)
    if name not in ASSETS:
        missing = APIError(404, f"GET {UI_PATH}/{name} is not served by this daemon.", "not_found")
        return error_response("openai", missing)
    return Response(_asset(name), media_type=ASSETS[name], headers=SECURITY_HEADERS)


@get(UI_PATH, sync_to_thread=False)
def ui_page(request: Request[Any, Any, Any]) -> Response[Any]:
    return _serve(request, "index.html")


@get(f"{UI_PATH}/{{name:str}}", sync_to_thread=False)
def ui_asset(request: Request[Any, Any, Any], name: FromPath[str]) -> Response[Any]:
    return _serve(request, name)


def wants_page(request: Request[Any, Any, Any]) -> bool:
    """A browser navigating here: it asks for HTML first. Ollama's apps, curl and the
    health checks that probe `/` send no such Accept header and keep the 200."""
    accept = request.headers.get("accept", "")
    return "text/html" in accept.lower() and server_state(request).settings.server.dashboard


@get("/", sync_to_thread=False)
def root(request: Request[Any, Any, Any]) -> Response[str] | Redirect:
    if wants_page(request):
        return Redirect(request.scope.get("root_path", "") + UI_PATH, status_code=302)
    # Ollama's apps probe this exact text to find a server.
    return Response("Ollama is running", media_type="text/plain")


@head("/")
async def root_head() -> None:
    return None
