"""/v1/mcp/servers, /v1/mcp/tools, /v1/mcp/execute: MCP servers and tools over HTTP.

Behind the API keys like every /v1 route; errors in OpenAI's shape. A tool that fails
or times out is a 200 with `is_error: true`; only a bad request (400), an unknown tool
(404) or a server that is not connected (503) is an HTTP error.
"""

from __future__ import annotations

import json
from typing import Any

from litestar import Request, Router, get, post
from pydantic import BaseModel, ConfigDict, Field, field_validator

from vllm_mlx.api.edge.body import parse_body
from vllm_mlx.api.error_shapes import openai_error_response
from vllm_mlx.api.errors import APIError
from vllm_mlx.api.state import server_state
from vllm_mlx.mcp.manager import ToolNotFoundError
from vllm_mlx.mcp.supervisor import ServerUnavailableError


class ExecuteRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tool_name: str = Field(min_length=1, max_length=256)
    arguments: dict[str, Any] = Field(default_factory=dict)

    @field_validator("arguments", mode="before")
    @classmethod
    def _json_text(cls, value: Any) -> Any:
        # OpenAI tool calls carry arguments as a JSON string; take those as they are.
        if isinstance(value, str):
            try:
                value = json.loads(value or "{}")
            except json.JSONDecodeError as exc:
                raise ValueError(f"arguments is not valid JSON: {exc.msg}") from exc
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise ValueError("arguments must be a JSON object")
        return value


@get("/mcp/servers", sync_to_thread=False)
def list_servers(request: Request[Any, Any, Any]) -> dict[str, Any]:
    return {"servers": server_state(request).mcp.status()}


@get("/mcp/tools", sync_to_thread=False)
def list_tools(request: Request[Any, Any, Any]) -> dict[str, Any]:
    tools = [tool.openai() for tool in server_state(request).mcp.tools()]
    return {"tools": tools, "count": len(tools)}


@post("/mcp/execute", status_code=200)
async def execute(request: Request[Any, Any, Any]) -> dict[str, Any]:
    body = await parse_body(request, ExecuteRequest)
    try:
        result = await server_state(request).mcp.execute(body.tool_name, body.arguments)
    except ToolNotFoundError as exc:
        raise APIError(404, str(exc), "not_found", "tool_name", "tool_not_found") from exc
    except ServerUnavailableError as exc:
        raise APIError(503, str(exc), "unavailable", code="mcp_server_unavailable") from exc
    return result.as_dict()


def make_mcp_router() -> Router:
    return Router(
        path="/v1",
        route_handlers=[list_servers, list_tools, execute],
        exception_handlers={Exception: openai_error_response},
    )
