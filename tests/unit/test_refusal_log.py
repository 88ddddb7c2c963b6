"""The refusal log line reads the error the client got back, in each protocol's shape."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from vllm_mlx.api.edge.refusals import MAX_CAPTURED, MAX_MESSAGE, BodyCapture, error_fields


def test_each_protocols_error_shape_is_read() -> None:
    openai = {"error": {"message": "bad", "type": "invalid_request_error", "param": "x"}}
    anthropic = {"type": "error", "error": {"type": "not_found_error", "message": "no model"}}
    assert error_fields(json.dumps(openai).encode()) == ("invalid_request_error", "bad")
    assert error_fields(json.dumps(anthropic).encode()) == ("not_found_error", "no model")
    assert error_fields(b'{"error": "keep_alive: bad"}') == (None, "keep_alive: bad")
    assert error_fields(json.dumps({"error": "x" * 5000}).encode())[1] == "x" * MAX_MESSAGE


@given(st.binary(max_size=200))
def test_any_body_is_read_without_raising(body: bytes) -> None:
    kind, message = error_fields(body)
    assert kind is None or isinstance(kind, str)
    assert message is None or len(message) <= MAX_MESSAGE


def test_only_4xx_bodies_are_kept_and_never_more_than_the_cap() -> None:
    ok = BodyCapture()
    ok.see({"type": "http.response.start", "status": 200})
    ok.see({"type": "http.response.body", "body": b"x" * 100})
    assert ok.chunks == []
    refused = BodyCapture()
    refused.see({"type": "http.response.start", "status": 413})
    for _ in range(3):
        refused.see({"type": "http.response.body", "body": b"y" * MAX_CAPTURED, "more_body": True})
    assert refused.size == MAX_CAPTURED == sum(len(c) for c in refused.chunks)
