"""Operational routes: /health."""

from __future__ import annotations

from typing import Any

from litestar import Request, Response, get

from vllm_mlx.api.state import ServerState


@get("/health", sync_to_thread=False)
def health(request: Request[Any, Any, Any]) -> Response[dict[str, Any]]:
    """200 once every model is loaded and the server is not draining, else 503."""
    state: ServerState = request.app.state.server
    models = [
        {"name": e.settings.name, "state": e.state.value, **({"error": e.error} if e.error else {})}
        for e in state.registry.entries()
    ]
    if state.draining:
        return Response({"status": "draining", "models": models}, status_code=503)
    if not state.registry.ready:
        return Response({"status": "loading", "models": models}, status_code=503)
    return Response({"status": "ok", "models": models}, status_code=200)
