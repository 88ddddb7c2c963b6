"""Generated request bodies against every POST route of a real daemon (hypothesis).

Each body starts from a valid request and has some of the route's fields (every
property the published spec lists for it, plus the extensions this daemon reads)
replaced by arbitrary JSON. Whatever comes back: never a 5xx, errors in the
protocol's own shape (checked against the published specs), and the daemon still
serves a normal request afterwards. Bounded for CI: derandomized, a fixed number of
examples per route, at most a few generated tokens per request.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.conftest import DaemonProcess, running
from tests.support import anthropic as anthropic_spec
from tests.support.spec import load_spec, validate_openai

EXAMPLES = 50  # per route: about 60 s for the four on the 2-core CI machine
MAX_TOKENS = 3

# Fields checked against the model (vocabulary size, seed range): values on both sides
# of each bound, often, since arbitrary JSON rarely lands near one.
_ids = st.integers(0, 2**40).map(str) | st.sampled_from(["49151", "49152", "²", "١", "-1", ""])
MODEL_BOUND: dict[str, st.SearchStrategy[Any]] = {
    "logit_bias": st.dictionaries(_ids, st.integers(-200, 200) | st.floats(), max_size=3),
    "top_k": st.integers(-(2**70), 2**70) | st.integers(49_000, 50_000),
    "seed": st.integers(-(2**70), 2**70) | st.sampled_from([-1, 2**63, 2**64 - 1, 2**64]),
}


def _spec_fields(spec: str, name: str) -> set[str]:
    schemas = load_spec(spec)["components"]["schemas"]
    fields: set[str] = set()

    def collect(schema: dict[str, Any]) -> None:
        if "$ref" in schema:
            collect(schemas[schema["$ref"].rsplit("/", 1)[-1]])
        for part in schema.get("allOf", []):
            collect(part)
        fields.update(schema.get("properties", {}))

    collect(schemas[name])
    return fields


OPENAI_EXTRAS = {"top_k", "min_p", "repetition_penalty", "timeout", "chat_template_kwargs"}
CHAT = {"model": "default", "messages": [{"role": "user", "content": "Hi"}]}
# route: protocol, a valid body, (spec, request schema), fields the daemon reads beyond it
ROUTES: dict[str, tuple[str, dict[str, Any], tuple[str, str], set[str]]] = {
    "/v1/chat/completions": (
        "openai",
        CHAT,
        ("openai-openapi.yaml", "CreateChatCompletionRequest"),
        OPENAI_EXTRAS | {"chat_template"},
    ),
    "/v1/completions": (
        "openai",
        {"model": "default", "prompt": "Hi"},
        ("openai-openapi.yaml", "CreateCompletionRequest"),
        OPENAI_EXTRAS,
    ),
    "/v1/messages": (
        "anthropic",
        CHAT,
        ("anthropic-hosted_spec.json", "CreateMessageParams"),
        {"top_k"},
    ),
    "/v1/messages/count_tokens": (
        "anthropic",
        CHAT,
        ("anthropic-hosted_spec.json", "BetaCountMessageTokensParams"),
        set(),
    ),
}

_odd_text = st.sampled_from(
    ["", " ", "\ud800", "²", "9" * 40, "default", "user", "assistant", "text", "{}", "null"]
)
# Every Unicode category, lone surrogates (Cs) included: JSON can carry them as \ud800.
_any_text = st.text(st.characters(exclude_categories=()), max_size=20)
_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.integers(-3, 3)
    | st.floats(allow_nan=False, allow_infinity=False)
    | _any_text
    | _odd_text
)
json_values = st.recursive(
    _scalars,
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(st.text(max_size=8) | _odd_text, children, max_size=3)
    ),
    max_leaves=12,
)
# Shapes close to valid messages reach deeper validation than arbitrary JSON does.
_blocks = st.lists(
    st.fixed_dictionaries(
        {"type": st.sampled_from(["text", "image", "tool_use", "tool_result", "x"])},
        optional={"text": json_values, "id": json_values, "content": json_values},
    ),
    max_size=2,
)
messages = st.lists(
    st.fixed_dictionaries(
        {
            "role": st.sampled_from(["user", "assistant", "system", "tool", "developer", "x"]),
            "content": _any_text | _blocks | json_values,
        }
    ),
    max_size=3,
)


def bodies(route: str) -> st.SearchStrategy[dict[str, Any]]:
    _, base, (spec, schema), extras = ROUTES[route]
    fields = _spec_fields(spec, schema) | extras
    names = sorted(fields - {"max_tokens", "max_completion_tokens"})
    changes = st.lists(st.sampled_from(names), max_size=4, unique=True).flatmap(
        lambda keys: st.fixed_dictionaries({k: MODEL_BOUND.get(k, json_values) for k in keys})
    )
    return st.builds(
        lambda change, msgs: {
            **base,
            **({"messages": msgs} if msgs is not None else {}),
            **change,
            # Tokens stay few: the point is the boundary, not generation.
            **({} if route.endswith("count_tokens") else {"max_tokens": MAX_TOKENS}),
        },
        changes,
        st.none() | messages if "messages" in base else st.none(),
    )


@pytest.fixture(scope="module")
def daemon(
    tmp_path_factory: pytest.TempPathFactory, model_cache_dir: Path
) -> Iterator[DaemonProcess]:
    with running(tmp_path_factory.mktemp("fuzz"), model_cache_dir) as process:
        yield process


def check_error(protocol: str, body: Any) -> None:
    if protocol == "anthropic":
        anthropic_spec.validate(body, "ErrorResponse")
    else:
        validate_openai("ErrorResponse", body)


def check_reply(protocol: str, response: httpx.Response, streamed: bool) -> None:
    assert response.status_code < 500, response.text[:500]
    if response.status_code >= 400:
        check_error(protocol, response.json())
        return
    if not streamed:
        assert isinstance(response.json(), dict)
        return
    for line in response.text.splitlines():  # an error event mid-stream is a failure too
        if line.startswith("data: {"):
            event = json.loads(line[6:])
            kind = event.get("error", {}).get("type") if isinstance(event, dict) else None
            assert kind not in ("server_error", "api_error"), line


def send(daemon: DaemonProcess, route: str, body: dict[str, Any]) -> None:
    protocol = ROUTES[route][0]
    response = httpx.post(
        f"{daemon.base_url}{route}",
        content=json.dumps(body).encode(),
        headers={"content-type": "application/json", "anthropic-version": "2023-06-01"}
        if protocol == "anthropic"
        else {"content-type": "application/json"},
        timeout=120,
    )
    check_reply(protocol, response, body.get("stream") is True)


def still_serves(daemon: DaemonProcess) -> None:
    assert httpx.get(f"{daemon.base_url}/health", timeout=30).status_code == 200
    for route, (_, base, _, _) in ROUTES.items():
        body = base if route.endswith("count_tokens") else {**base, "max_tokens": 2}
        response = httpx.post(f"{daemon.base_url}{route}", json=body, timeout=120)
        assert response.status_code == 200, (route, response.text)
        if "completions" in route:
            assert response.json()["choices"], response.text


FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,  # the same bodies on every run: CI failures reproduce
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


# Bodies that broke the daemon once: tried first on every run, before generated ones.
DEEP = {"a": 1}
for _ in range(150):  # deeper than prepare.MAX_DEPTH
    DEEP = {"a": DEEP}
KNOWN: dict[str, list[dict[str, Any]]] = {
    "/v1/chat/completions": [
        {**CHAT, "logit_bias": {"²": 1}},
        {**CHAT, "logit_bias": {"49152": 100}},  # one past the vocabulary: crashed MLX
        {**CHAT, "top_k": 49152, "temperature": 1, "seed": 2**64},
        {**CHAT, "stream": "yes"},
        {**CHAT, "chat_template_kwargs": DEEP},
    ],
    "/v1/completions": [
        {"model": "default", "prompt": "\ud800"},
        {"model": "default", "prompt": "Hi", "logit_bias": {"١": 1}},
    ],
    "/v1/messages": [
        {**CHAT, "temperature": None},
        {**CHAT, "top_k": 10**6},
        {**CHAT, "metadata": DEEP},
        # Found by this test: the error message quoted the key, unencodable as UTF-8.
        {
            **CHAT,
            "messages": [{"role": "user", "content": [{"type": "text", "text": {"\ud800": 1}}]}],
        },
    ],
    "/v1/messages/count_tokens": [{**CHAT, "tools": [{"name": "t", "input_schema": DEEP}]}],
}


@pytest.mark.parametrize("route", list(ROUTES))
def test_generated_bodies_never_break_the_daemon(daemon: DaemonProcess, route: str) -> None:
    def one(body: dict[str, Any]) -> None:
        if not route.endswith("count_tokens"):
            body = {**body, "max_tokens": MAX_TOKENS}
        send(daemon, route, body)

    test = given(body=bodies(route))(one)
    for known in KNOWN[route]:
        test = example(body=known)(test)
    FUZZ(test)()
    still_serves(daemon)
