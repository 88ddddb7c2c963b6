"""Request bodies, checked before anything reads them: valid JSON, an object, bounded
nesting and text, no lone surrogates; then validated into the route's wire model.

Parsing runs off the event loop (a body may be 32 MiB), bounded by limits.prompt_timeout.
"""

from __future__ import annotations

import json
import re
from typing import Any, TypeVar

from litestar import Request
from pydantic import BaseModel

from vllm_mlx.api.errors import APIError, bad_request
from vllm_mlx.api.pipeline.offload import off_loop
from vllm_mlx.api.state import request_settings

RequestModel = TypeVar("RequestModel", bound=BaseModel)

MAX_DEPTH = 100  # JSON nesting: tool schemas need a few dozen levels, nothing needs more
_SURROGATE = re.compile("[\ud800-\udfff]")


def _validated(raw: bytes, model: type[RequestModel], max_chars: int) -> RequestModel:
    return model.model_validate(parse_json(raw, max_chars))


async def parse_body(request: Request[Any, Any, Any], model: type[RequestModel]) -> RequestModel:
    """The JSON body validated into `model`, off the event loop.

    Bad JSON is a 400 here; validation errors map to 400 in the route's handler.
    """
    limits = request_settings(request).limits
    raw = await request.body()
    return await off_loop(
        _validated, raw, model, limits.max_prompt_chars, limit_s=limits.prompt_timeout
    )


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _loc(path: tuple[str | int, ...]) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")


def check_text(payload: Any, max_chars: int) -> None:
    """Nesting depth, total characters and lone surrogates of a parsed JSON body.

    Iterative, so no depth of nesting can overflow the stack; one pass over every
    string, key or value, so nothing escapes the character bound.
    """
    total = 0
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(payload, ())]
    while stack:
        value, path = stack.pop()
        if len(path) > MAX_DEPTH:
            raise bad_request(f"the request body nests deeper than {MAX_DEPTH} levels")
        if isinstance(value, dict):
            for key, item in value.items():
                stack.append((key, path))  # keys are text too
                stack.append((item, (*path, key)))
        elif isinstance(value, list):
            stack.extend((item, (*path, index)) for index, item in enumerate(value))
        elif isinstance(value, str):
            total += len(value)
            if not value.isascii() and _SURROGATE.search(value):
                param = _loc(path) or None
                raise bad_request(
                    f"'{param}' contains a lone UTF-16 surrogate, which is not valid Unicode",
                    param,
                )
    if total > max_chars:
        raise APIError(
            413,
            f"The request carries {total} characters of text, more than "
            f"limits.max_prompt_chars ({max_chars}).",
            "too_large",
            code="prompt_too_large",
        )


def parse_json(raw: bytes, max_chars: int) -> dict[str, Any]:
    """The body as a JSON object, checked by check_text; malformed bodies are a 400."""
    try:
        payload = json.loads(raw, parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
        raise bad_request(f"the request body is not valid JSON: {exc}") from exc
    except RecursionError:
        raise bad_request(f"the request body nests deeper than {MAX_DEPTH} levels") from None
    if not isinstance(payload, dict):
        raise bad_request("the request body must be a JSON object")
    check_text(payload, max_chars)
    return payload
