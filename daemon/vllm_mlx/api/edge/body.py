"""Request helpers every protocol's routes share."""

from __future__ import annotations

from typing import Any, TypeVar

from litestar import Request
from pydantic import BaseModel

from vllm_mlx.api.pipeline.offload import off_loop, parse_json
from vllm_mlx.api.state import ServerState

RequestModel = TypeVar("RequestModel", bound=BaseModel)


def server_state(request: Request[Any, Any, Any]) -> ServerState:
    state: ServerState = request.app.state.server
    return state


def _validated(raw: bytes, model: type[RequestModel], max_chars: int) -> RequestModel:
    return model.model_validate(parse_json(raw, max_chars))


async def parse_body(request: Request[Any, Any, Any], model: type[RequestModel]) -> RequestModel:
    """The JSON body validated into `model`, off the event loop (a body may be 32 MiB).

    Bad JSON is a 400 here; validation errors map to 400 in the route's handler.
    """
    limits = server_state(request).settings.limits
    raw = await request.body()
    return await off_loop(
        _validated, raw, model, limits.max_prompt_chars, limit_s=limits.prompt_timeout
    )
