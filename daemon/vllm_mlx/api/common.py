"""Request helpers every protocol's routes share."""

from __future__ import annotations

import json
from typing import Any, TypeVar

from litestar import Request
from pydantic import BaseModel

from vllm_mlx.api.errors import bad_request
from vllm_mlx.api.state import ServerState

RequestModel = TypeVar("RequestModel", bound=BaseModel)


def server_state(request: Request[Any, Any, Any]) -> ServerState:
    state: ServerState = request.app.state.server
    return state


async def parse_body(request: Request[Any, Any, Any], model: type[RequestModel]) -> RequestModel:
    """The JSON body validated into `model`; bad JSON is a 400 (validation errors map later)."""
    raw = await request.body()
    try:
        payload = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise bad_request(f"the request body is not valid JSON: {exc}") from exc
    if not isinstance(payload, dict):
        raise bad_request("the request body must be a JSON object")
    return model.model_validate(payload)
