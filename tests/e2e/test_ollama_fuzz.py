"""Generated request bodies against every /api/* route of a real daemon (hypothesis).

Each body starts from a valid request and has some of the route's fields (every
property Ollama's spec lists for it, plus the ones its prose reference and clients use)
replaced by arbitrary JSON, with `messages`, `options` and `tools` drawn close to valid
so that validation deeper than the top level is reached. Whatever comes back: never a
5xx, every refusal in Ollama's shape ({"error": "..."}), a 200 stream whose objects are
all JSON objects with no error among them and a last one that says it is done, and the
daemon still serves normal requests afterwards. Then bodies that are not JSON objects
at all. Bounded for CI: derandomized, a fixed number of examples per route, at most a
few generated tokens per request (limits.max_request_tokens).
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
from tests.e2e.test_boundary_fuzz import DEEP, json_values
from tests.support.ollama import NDJSON, check_error
from tests.support.replay import HERMES_CALL, PARSERS
from tests.support.spec import load_spec

EMBED = "all-minilm-l6-v2"
MAX_TOKENS = 3
HI = [{"role": "user", "content": "Hi"}]


def _spec_fields(name: str) -> set[str]:
    schema = load_spec("ollama-openapi.yaml")["components"]["schemas"][name]
    return set(schema.get("properties", {}))


# route: method, a valid body, the fields to vary (the spec's, and what clients also send),
# how many generated bodies
ROUTES: dict[str, tuple[str, dict[str, Any], set[str], int]] = {
    "/api/chat": (
        "POST",
        {"model": "default", "messages": HI},
        _spec_fields("ChatRequest"),
        60,
    ),
    "/api/generate": (
        "POST",
        {"model": "default", "prompt": "Hi"},
        _spec_fields("GenerateRequest") | {"template", "context"},
        60,
    ),
    "/api/embed": ("POST", {"model": EMBED, "input": "Hi"}, _spec_fields("EmbedRequest"), 30),
    "/api/embeddings": (
        "POST",
        {"model": EMBED, "prompt": "Hi"},
        {"model", "prompt", "options", "keep_alive"},
        20,
    ),
    "/api/show": ("POST", {"model": "default"}, _spec_fields("ShowRequest") | {"name"}, 20),
    "/api/pull": (
        "POST",
        {"model": "default", "stream": False},
        _spec_fields("PullRequest") | {"name"},
        15,
    ),
    "/api/push": ("POST", {"model": "default"}, _spec_fields("PushRequest"), 10),
    "/api/create": (
        "POST",
        {"model": "x", "from": "default"},
        _spec_fields("CreateRequest") | {"files", "adapters"},
        10,
    ),
    "/api/copy": (
        "POST",
        {"source": "default", "destination": "x"},
        _spec_fields("CopyRequest"),
        10,
    ),
    "/api/delete": ("DELETE", {"model": "default"}, _spec_fields("DeleteRequest"), 10),
}
GET_ROUTES = ["/api/tags", "/api/ps", "/api/version"]

# Values near each field's edges, often: arbitrary JSON rarely lands on one.
_models = st.sampled_from(
    ["default", "default:latest", "replay", EMBED, "default:7b", "", ":", "default:", "x" * 300]
)
_ints = st.integers(-(2**70), 2**70) | st.integers(-3, 3) | st.sampled_from([2**31, 2**63, 8192])
_numbers = _ints | st.floats(allow_nan=False) | st.sampled_from([0.0, -0.0, 1e308, -1e308])
OPTION_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "seed": _ints,
    "top_k": _ints | st.integers(49_000, 50_000),
    "num_predict": _ints,
    "num_ctx": _ints | st.integers(8190, 8194),
    "temperature": _numbers,
    "top_p": _numbers,
    "min_p": _numbers,
    "repeat_penalty": _numbers,
    "presence_penalty": _numbers,
    "frequency_penalty": _numbers,
    "repeat_last_n": _ints,
    "stop": st.lists(st.text(max_size=4), max_size=5) | st.text(max_size=3),
    "mirostat": _ints,
    "num_gpu": _ints,
}
options = st.lists(
    st.sampled_from(sorted(OPTION_VALUES)) | st.text(max_size=6), max_size=4, unique=True
).flatmap(
    lambda keys: st.fixed_dictionaries({k: OPTION_VALUES.get(k, json_values) for k in keys})
) | json_values  # fmt: skip
_tool_calls = st.lists(
    st.fixed_dictionaries(
        {
            "function": st.fixed_dictionaries(
                {"name": st.text(max_size=8) | json_values}, optional={"arguments": json_values}
            )
        }
    )
    | json_values,
    max_size=2,
)
messages = st.lists(
    st.fixed_dictionaries(
        {
            "role": st.sampled_from(["user", "assistant", "system", "tool", "developer", "x"])
            | json_values,
            "content": st.text(st.characters(exclude_categories=()), max_size=20) | json_values,
        },
        optional={
            "images": st.lists(st.sampled_from(["aGk=", "", "!"]), max_size=2) | json_values,
            "tool_calls": _tool_calls,
            "tool_name": json_values,
            "thinking": json_values,
        },
    )
    | json_values,
    max_size=3,
)
tools = st.lists(
    st.fixed_dictionaries(
        {
            "type": st.sampled_from(["function", "x"]),
            "function": st.fixed_dictionaries(
                {"name": st.sampled_from(["get_weather", "", "f"]) | json_values},
                optional={"parameters": json_values, "description": json_values},
            )
            | json_values,
        }
    ),
    max_size=2,
) | json_values  # fmt: skip
FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "model": _models | json_values,
    "name": _models | json_values,
    "messages": messages | json_values,
    "options": options,
    "tools": tools,
    "format": st.sampled_from(["json", "", "xml"])
    | st.fixed_dictionaries(
        {"type": st.sampled_from(["object", "string", "x"])},
        optional={"properties": json_values, "enum": json_values},
    )
    | json_values,
    "think": st.sampled_from([True, False, "low", "max", "extreme"]) | json_values,
    "keep_alive": st.sampled_from([0, "0", "0s", "5m", -1, "1h", "x", "-5m", 1e300]) | json_values,
    "stream": st.booleans() | json_values,
    "input": st.lists(st.text(max_size=10), max_size=3) | json_values,
    "images": st.lists(st.sampled_from(["aGk=", "!"]), max_size=2) | json_values,
}


def bodies(route: str) -> st.SearchStrategy[dict[str, Any]]:
    _, base, fields, _ = ROUTES[route]
    names = sorted(fields)
    changes = st.lists(st.sampled_from(names), max_size=4, unique=True).flatmap(
        lambda keys: st.fixed_dictionaries({k: FIELDS.get(k, json_values) for k in keys})
    )
    return changes.map(lambda change: {**base, **change})


@pytest.fixture(scope="module")
def daemon(
    tmp_path_factory: pytest.TempPathFactory, model_cache_dir: Path
) -> Iterator[DaemonProcess]:
    config = {
        "models": [
            {
                "name": "smollm2-135m-instruct",
                "source": "builtin:smollm2-135m-instruct",
                "aliases": ["default"],
            },
            {"name": EMBED, "source": f"builtin:{EMBED}", "task": "embed"},
            {"name": "replay", "source": f"replay:{HERMES_CALL}", **PARSERS},
        ],
        # Every generation is a few tokens, whatever num_predict says.
        "limits": {"max_request_tokens": MAX_TOKENS},
        "defaults": {"max_tokens": MAX_TOKENS},
    }
    with running(tmp_path_factory.mktemp("ollama-fuzz"), model_cache_dir, config) as process:
        yield process


def check_reply(route: str, response: httpx.Response) -> None:
    assert response.status_code < 500, response.text[:500]
    if response.status_code >= 400:
        check_error(response)
        return
    if response.headers.get("content-type", "").startswith(NDJSON):
        lines = response.text.splitlines()
        assert lines, "an empty stream"
        objects = [json.loads(line) for line in lines]
        assert all(isinstance(o, dict) for o in objects), lines[:5]
        errors = [o for o in objects if "error" in o]
        assert not errors, errors  # an input the routes took must not fail mid-stream
        last = objects[-1]
        assert last.get("done") is True or last.get("status") == "success", last
        return
    assert isinstance(response.json(), dict), response.text[:500]


def send(daemon: DaemonProcess, route: str, content: bytes) -> httpx.Response:
    method = ROUTES[route][0] if route in ROUTES else "GET"
    return httpx.request(
        method,
        f"{daemon.base_url}{route}",
        content=content,
        headers={"content-type": "application/json"},
        timeout=120,
    )


def still_serves(daemon: DaemonProcess) -> None:
    url = daemon.base_url
    assert httpx.get(f"{url}/", timeout=30).text == "Ollama is running"
    for route in GET_ROUTES:
        assert httpx.get(f"{url}{route}", timeout=30).status_code == 200, route
    for route, body in [
        ("/api/chat", {"model": "default", "messages": HI, "stream": False}),
        ("/api/generate", {"model": "default", "prompt": "Hi", "stream": False}),
        ("/api/embed", {"model": EMBED, "input": "Hi"}),
        ("/api/embeddings", {"model": EMBED, "prompt": "Hi"}),
        ("/api/show", {"model": "default"}),
    ]:
        response = httpx.post(f"{url}{route}", json=body, timeout=120)
        assert response.status_code == 200, (route, response.text)
    streamed = httpx.post(f"{url}/api/chat", json={"model": "default", "messages": HI}, timeout=120)
    assert json.loads(streamed.text.splitlines()[-1])["done"] is True


FUZZ: dict[str, Any] = dict(
    deadline=None,
    derandomize=True,  # the same bodies on every run: CI failures reproduce
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

# Bodies tried first on every run, before generated ones.
KNOWN: dict[str, list[dict[str, Any]]] = {
    "/api/chat": [
        {"model": "default", "messages": HI, "options": {"top_k": 49152, "seed": 2**64}},
        {"model": "default", "messages": HI, "options": {"num_ctx": 10**12}},
        {"model": "default", "messages": HI, "options": {"temperature": -1, "top_p": 7}},
        {"model": "default", "messages": HI, "format": {"type": "object", "properties": DEEP}},
        {"model": "default", "messages": [{"role": "user", "content": "\ud800"}]},
        {"model": "default", "messages": HI, "options": {"stop": [""]}},
        {"model": "replay", "messages": HI, "tools": [{"type": "function", "function": {}}]},
        {
            "model": "default",
            "messages": [
                {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": 5}}]}
            ],
        },
        {"model": "default", "messages": HI, "keep_alive": 1e300},
    ],
    "/api/generate": [
        {"model": "default", "prompt": "Hi", "raw": True, "options": {"num_predict": 0}},
        {"model": "default", "prompt": "\ud800"},
        {"model": "default", "prompt": "Hi", "context": [2**40, -1]},
        {"model": "default", "prompt": "Hi", "template": "{{ .Prompt }}"},
        {"model": "default", "prompt": "", "keep_alive": "x"},
    ],
    "/api/embed": [
        {"model": EMBED, "input": []},
        {"model": EMBED, "input": [""]},
        {"model": EMBED, "input": "Hi", "dimensions": 0},
        {"model": EMBED, "input": "Hi", "dimensions": 10**9},
    ],
    "/api/embeddings": [{"model": EMBED, "prompt": ""}],
    "/api/show": [{"model": "default", "verbose": "yes"}],
    "/api/pull": [{"model": "default:latest"}, {"name": "default"}],
    "/api/push": [{}],
    "/api/create": [{"model": "x", "files": DEEP}],
    "/api/copy": [{}],
    "/api/delete": [{}],
}


@pytest.mark.parametrize("route", list(ROUTES))
def test_generated_bodies_never_break_the_daemon(daemon: DaemonProcess, route: str) -> None:
    def one(body: dict[str, Any]) -> None:
        check_reply(route, send(daemon, route, json.dumps(body).encode()))

    test = given(body=bodies(route))(one)
    for known in KNOWN[route]:
        test = example(body=known)(test)
    settings(max_examples=ROUTES[route][3], **FUZZ)(test)()
    still_serves(daemon)


not_objects = (
    st.binary(max_size=40)
    | json_values.filter(lambda v: not isinstance(v, dict)).map(
        lambda v: json.dumps(v).encode()
    )
    | st.sampled_from([b"", b"{", b'{"model": "default"', b"\xff\xfe", b"null", b"[]"])
)  # fmt: skip


@pytest.mark.parametrize("route", list(ROUTES))
def test_bodies_that_are_no_json_object_are_400(daemon: DaemonProcess, route: str) -> None:
    def one(content: bytes) -> None:
        response = send(daemon, route, content)
        check_error(response, 400)

    settings(max_examples=15, **FUZZ)(given(content=not_objects)(one))()
    still_serves(daemon)


@pytest.mark.parametrize("route", GET_ROUTES)
def test_get_routes_ignore_whatever_body_comes(daemon: DaemonProcess, route: str) -> None:
    def one(content: bytes) -> None:
        response = send(daemon, route, content)
        assert response.status_code == 200, response.text[:300]
        assert isinstance(response.json(), dict)

    settings(max_examples=10, **FUZZ)(given(content=not_objects)(one))()
