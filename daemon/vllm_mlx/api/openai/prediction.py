"""OpenAI's Predicted Outputs on chat completions: `prediction: {type: "content",
content: <text or text parts>}`, the text the reply is expected to repeat (a file being
rewritten with small changes). Its tokens feed the request's prompt lookup
(docs/speculative.md): the reply is the one the model writes anyway, sooner where it
matches, and usage reports the proposed tokens accepted and rejected."""

from __future__ import annotations

from typing import Any

from vllm_mlx.api.errors import bad_request

MAX_PREDICTION_CHARS = 1024 * 1024  # a file, not a corpus (the body limit applies too)


def prediction_text(value: dict[str, Any] | None) -> str | None:
    """The prediction's text, or None without one; a malformed one is a 400."""
    if value is None:
        return None
    if value.get("type") != "content" or "content" not in value or len(value) != 2:
        raise bad_request(
            'prediction must be {"type": "content", "content": <text or text parts>}',
            "prediction",
        )
    content = value["content"]
    if isinstance(content, list):
        parts = []
        for index, part in enumerate(content):
            if (
                not isinstance(part, dict)
                or part.get("type") != "text"
                or not isinstance(part.get("text"), str)
            ):
                raise bad_request(
                    'prediction.content parts must be {"type": "text", "text": <string>}',
                    f"prediction.content[{index}]",
                )
            parts.append(part["text"])
        content = "".join(parts)
    if not isinstance(content, str):
        raise bad_request("prediction.content must be a string or text parts", "prediction")
    if len(content) > MAX_PREDICTION_CHARS:
        raise bad_request(
            f"prediction.content is longer than {MAX_PREDICTION_CHARS} characters",
            "prediction.content",
        )
    return content
