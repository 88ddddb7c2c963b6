"""Protocol-neutral API errors and the one function that maps exceptions to them.

Each protocol router renders an APIError in its own wire shape (OpenAI or Anthropic).
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import ValidationError

from vllm_mlx.engine.types import EngineError, EngineUnavailableError, GenerationFailedError


@dataclass
class APIError(Exception):
    status: int
    message: str
    kind: str = "invalid_request"  # neutral kind; each protocol maps it to its type name
    param: str | None = None
    code: str | None = None
    headers: dict[str, str] | None = None

    def __post_init__(self) -> None:
        # Messages quote client input (a field name, a key); a lone surrogate in it
        # would make the error body itself unencodable.
        self.message = _printable(self.message)
        self.param = None if self.param is None else _printable(self.param)

    def __str__(self) -> str:
        return self.message


def _printable(text: str) -> str:
    return text if text.isascii() else text.encode("utf-8", "replace").decode("utf-8")


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, "invalid_request", param, code)


def model_not_found(model: str) -> APIError:
    return APIError(
        404,
        f"The model '{model}' does not exist; GET /v1/models lists the served models.",
        "not_found",
        "model",
        "model_not_found",
    )


def _loc(error_loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in error_loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def from_validation_error(exc: ValidationError) -> APIError:
    first = exc.errors(include_url=False)[0]
    param = _loc(tuple(first["loc"])) or None
    message = first["msg"].removeprefix("Value error, ")
    if first["type"] == "missing":
        message = f"'{param}' is a required property"
    elif param:
        message = f"Invalid value for '{param}': {message}"
    return bad_request(message, param)


def to_api_error(exc: Exception) -> APIError:
    """Every exception a handler can raise, as a status and a neutral error."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, ValidationError):
        return from_validation_error(exc)
    if isinstance(exc, EngineError):
        return bad_request(str(exc))
    if isinstance(exc, EngineUnavailableError):
        return APIError(503, str(exc), "unavailable", code="service_unavailable")
    if isinstance(exc, GenerationFailedError):
        return APIError(500, f"generation failed: {exc}", "server_error", code="engine_error")
    if isinstance(exc, TimeoutError):
        return APIError(504, "the request timed out", "timeout", code="timeout")
    return APIError(500, "internal server error", "server_error")
