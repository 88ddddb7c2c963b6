"""POST /v1/embeddings on a real daemon: the openai SDK, LangChain and plain HTTP.

One daemon for the module serves the chat model and the bundled embedding model
(twice: once as configured by default, once marked Matryoshka-capable so that
`dimensions` can be exercised). Vectors are compared with the sentence-transformers
reference in tests/fixtures/embeddings/reference.json.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import DaemonProcess, StartDaemon, running
from tests.support.spec import validate_openai

MODEL = "all-minilm-l6-v2"
MATRYOSHKA = "minilm-matryoshka"
REFERENCE = Path(__file__).resolve().parents[1] / "fixtures" / "embeddings" / "reference.json"
ITEMS: list[dict[str, Any]] = json.loads(REFERENCE.read_text())["items"]
TEXTS = [item["text"] for item in ITEMS]
LONG_TEXT = "word " * 1000  # ~1000 tokens: over the model's 256


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
            {
                "name": MODEL,
                "source": "builtin:all-minilm-l6-v2",
                "task": "embed",
                "aliases": ["text-embedding-3-small"],
            },
            {
                "name": MATRYOSHKA,
                "source": "builtin:all-minilm-l6-v2",
                "task": "embed",
                "matryoshka": True,
            },
        ],
        "engine": {"embedding_batch_size": 8},
        "metrics": {"enabled": True},
    }
    with running(tmp_path_factory.mktemp("embeddings"), model_cache_dir, config) as process:
        yield process


@pytest.fixture(scope="module")
def client(daemon: DaemonProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{daemon.base_url}/v1", api_key="unused", max_retries=0)


def post(daemon: DaemonProcess, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{daemon.base_url}/v1/embeddings", json=body, timeout=120)


def cosine(a: Any, b: Any) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_sdk_float_vectors_match_sentence_transformers(client: openai.OpenAI) -> None:
    reply = client.embeddings.create(model=MODEL, input=TEXTS, encoding_format="float")
    assert [d.index for d in reply.data] == list(range(len(TEXTS)))
    for item, data in zip(ITEMS, reply.data, strict=True):
        assert len(data.embedding) == 384
        assert cosine(data.embedding, item["embedding"]) >= 0.9999, item["text"]
    tokens = sum(len(item["token_ids"]) for item in ITEMS)
    assert reply.usage.prompt_tokens == reply.usage.total_tokens == tokens
    assert reply.model == MODEL


def test_sdk_default_base64_equals_float(client: openai.OpenAI, daemon: DaemonProcess) -> None:
    # Without encoding_format the SDK asks for base64 and decodes it itself.
    decoded = client.embeddings.create(model="text-embedding-3-small", input=TEXTS[:3])
    floats = post(daemon, {"model": MODEL, "input": TEXTS[:3]}).json()
    for got, want in zip(decoded.data, floats["data"], strict=True):
        assert np.array_equal(np.float32(got.embedding), np.float32(want["embedding"]))
    validate_openai("CreateEmbeddingResponse", floats)  # the spec describes float arrays only
    raw = post(daemon, {"model": MODEL, "input": TEXTS[0], "encoding_format": "base64"}).json()
    assert raw["usage"]["prompt_tokens"] == len(ITEMS[0]["token_ids"])
    vector = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), dtype="<f4")
    alone = post(daemon, {"model": MODEL, "input": TEXTS[0]}).json()["data"][0]["embedding"]
    assert np.array_equal(vector, np.float32(alone))  # the same batch, the same bits


def test_every_input_form(daemon: DaemonProcess) -> None:
    one = ITEMS[1]
    forms: list[Any] = [
        one["text"],
        [one["text"]],
        one["token_ids"],
        [one["token_ids"]],
    ]
    for form in forms:
        reply = post(daemon, {"model": MODEL, "input": form, "user": "someone"})
        assert reply.status_code == 200, reply.text
        validate_openai("CreateEmbeddingResponse", reply.json())
        (data,) = reply.json()["data"]
        assert cosine(data["embedding"], one["embedding"]) >= 0.9999
        assert reply.json()["usage"]["prompt_tokens"] == len(one["token_ids"])
    many = post(daemon, {"model": MODEL, "input": [i["token_ids"] for i in ITEMS[:5]]}).json()
    assert [d["index"] for d in many["data"]] == [0, 1, 2, 3, 4]
    for item, data in zip(ITEMS[:5], many["data"], strict=True):
        assert cosine(data["embedding"], item["embedding"]) >= 0.9999


def test_dimensions_on_a_matryoshka_model(client: openai.OpenAI) -> None:
    full = client.embeddings.create(model=MATRYOSHKA, input=TEXTS[0], encoding_format="float")
    cut = client.embeddings.create(
        model=MATRYOSHKA, input=TEXTS[0], dimensions=64, encoding_format="float"
    )
    vector = np.asarray(cut.data[0].embedding)
    assert vector.shape == (64,)
    assert abs(float(np.linalg.norm(vector)) - 1.0) < 1e-5
    head = np.asarray(full.data[0].embedding[:64])
    assert np.allclose(vector, head / np.linalg.norm(head), atol=1e-6)


@pytest.mark.parametrize(
    ("model", "dimensions", "status"),
    [(MODEL, 64, 400), (MODEL, 384, 200), (MATRYOSHKA, 385, 400), (MATRYOSHKA, 0, 400)],
)
def test_dimensions_bounds(daemon: DaemonProcess, model: str, dimensions: int, status: int) -> None:
    reply = post(daemon, {"model": model, "input": "hi", "dimensions": dimensions})
    assert reply.status_code == status, reply.text
    if status == 400:
        assert reply.json()["error"]["param"] == "dimensions"


BAD_INPUTS: list[tuple[Any, str]] = [
    ("", "input[0] is an empty string"),
    ([], "empty array"),
    (["ok", ""], "input[1] is an empty string"),
    ([[]], "input[0] is an empty array"),
    (3.5, "'input' must be"),
    ({"text": "hi"}, "'input' must be"),
    ([1, "x"], "input[1]"),
    (["x", 1], "input[1]"),
    ([True, False], "input[0]"),
    ([[101, 30522]], "token id 30522, outside"),
    ([-1], "token id -1, outside"),
    (None, "'input' must be"),
    (["x"] * 2049, "at most 2048"),
]


@pytest.mark.parametrize(("value", "message"), BAD_INPUTS)
def test_bad_input_is_a_400_in_openai_shape(
    daemon: DaemonProcess, value: Any, message: str
) -> None:
    reply = post(daemon, {"model": MODEL, "input": value})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert message in error["message"]
    assert error["type"] == "invalid_request_error"
    assert error["param"].startswith("input")


def test_other_bad_requests(daemon: DaemonProcess) -> None:
    assert post(daemon, {"model": MODEL}).status_code == 400  # no input
    reply = post(daemon, {"model": MODEL, "input": "x", "encoding_format": "hex"})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "encoding_format"
    unknown = post(daemon, {"model": "nope", "input": "x"})
    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] == "model_not_found"
    bad_json = httpx.post(
        f"{daemon.base_url}/v1/embeddings", content=b"{nope", timeout=30,
        headers={"content-type": "application/json"},
    )  # fmt: skip
    assert bad_json.status_code == 400


def test_too_long_input_names_index_and_count_unless_truncated(daemon: DaemonProcess) -> None:
    huge = "token " * 100_000
    reply = post(daemon, {"model": MODEL, "input": ["short", huge]})
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["param"] == "input[1]" and error["code"] == "context_length_exceeded"
    assert "input[1] has 100002 tokens" in error["message"] and "256" in error["message"]
    cut = post(daemon, {"model": MODEL, "input": ["short", LONG_TEXT], "truncate": True})
    assert cut.status_code == 200, cut.text
    assert cut.json()["usage"]["prompt_tokens"] == 3 + 256
    ids = post(daemon, {"model": MODEL, "input": [[101] * 300], "truncate": True})
    assert ids.status_code == 200 and ids.json()["usage"]["prompt_tokens"] == 256


def test_chat_and_embedding_models_refuse_each_other(
    client: openai.OpenAI, daemon: DaemonProcess
) -> None:
    with pytest.raises(openai.BadRequestError) as chat:
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
    assert "embedding model" in str(chat.value)
    with pytest.raises(openai.BadRequestError) as embed:
        client.embeddings.create(model="default", input="hi")
    assert "does not serve embeddings" in str(embed.value)
    anthropic = httpx.post(
        f"{daemon.base_url}/v1/messages",
        json={"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
        timeout=30,
    )
    assert anthropic.status_code == 400
    assert anthropic.json()["type"] == "error"
    assert "embedding model" in anthropic.json()["error"]["message"]


def test_32_concurrent_clients_match_sequential(client: openai.OpenAI) -> None:
    requests = [[TEXTS[i % len(TEXTS)], TEXTS[(i * 7) % len(TEXTS)]] for i in range(32)]

    def embed(texts: list[str]) -> list[list[float]]:
        reply = client.embeddings.create(model=MODEL, input=texts, encoding_format="float")
        return [d.embedding for d in reply.data]

    sequential = [embed(texts) for texts in requests]
    with ThreadPoolExecutor(max_workers=32) as pool:
        concurrent = list(pool.map(embed, requests))
    for seq, con in zip(sequential, concurrent, strict=True):
        for a, b in zip(seq, con, strict=True):
            # Batch composition changes float summation order, nothing more.
            assert np.allclose(a, b, atol=1e-5)
            assert cosine(a, b) >= 0.99999


def test_langchain_openai_embeddings(daemon: DaemonProcess) -> None:
    from langchain_openai import OpenAIEmbeddings

    # check_embedding_ctx_length=False: otherwise LangChain tokenizes with tiktoken and
    # sends OpenAI token ids, which mean nothing to another model's vocabulary.
    embeddings = OpenAIEmbeddings(
        model=MODEL,
        base_url=f"{daemon.base_url}/v1",
        api_key="unused",  # type: ignore[arg-type]
        check_embedding_ctx_length=False,
    )
    query = embeddings.embed_query(TEXTS[0])
    assert cosine(query, ITEMS[0]["embedding"]) >= 0.9999
    documents = embeddings.embed_documents(TEXTS[:6])
    for item, vector in zip(ITEMS[:6], documents, strict=True):
        assert cosine(vector, item["embedding"]) >= 0.9999


def test_listed_everywhere_and_counted(daemon: DaemonProcess, client: openai.OpenAI) -> None:
    ids = [m.id for m in client.models.list()]
    assert MODEL in ids and "text-embedding-3-small" in ids and MATRYOSHKA in ids
    health = httpx.get(f"{daemon.base_url}/health").json()
    tasks = {m["name"]: m["task"] for m in health["models"]}
    assert tasks == {"smollm2-135m-instruct": "generate", MODEL: "embed", MATRYOSHKA: "embed"}
    client.embeddings.create(model=MODEL, input=TEXTS[:2])
    status = httpx.get(f"{daemon.base_url}/v1/status").json()
    block = next(b for b in status["models"] if b["model"] == MODEL)
    assert block["task"] == "embed" and block["embedding"]["dimensions"] == 384
    assert block["embedding"]["max_input_tokens"] == 256
    assert block["total_requests_processed"] >= 1 and block["embedding"]["inputs_embedded"] >= 2
    text = httpx.get(f"{daemon.base_url}/metrics").text
    samples = {
        (s.name, s.labels.get("model_name")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert samples[("vllm_mlx_embedding_requests_total", MODEL)] >= 1
    assert samples[("vllm_mlx_embedding_input_tokens_total", MODEL)] >= 2
    assert samples[("vllm_mlx_embedding_request_duration_seconds_count", MODEL)] >= 1


def test_keys_rate_limit_and_timeout_apply(start_daemon: StartDaemon) -> None:
    # Only the embedding model: the daemon is up in seconds. A 1 ms timeout cannot be met
    # by any forward pass, so every admitted request is a 504.
    process = start_daemon(
        {
            "models": [{"name": MODEL, "source": "builtin:all-minilm-l6-v2", "task": "embed"}],
            "auth": {"api_keys": ["secret"], "rate_limit": 3},
            "server": {"timeout": 0.001},
        }
    )
    url = f"{process.base_url}/v1/embeddings"
    body = {"model": MODEL, "input": TEXTS[:4]}
    assert httpx.post(url, json=body, timeout=30).status_code == 401
    headers = {"authorization": "Bearer secret"}
    statuses = [httpx.post(url, json=body, headers=headers, timeout=30) for _ in range(4)]
    assert [r.status_code for r in statuses] == [504, 504, 504, 429]
    assert statuses[0].json()["error"]["code"] == "timeout"
    assert httpx.get(f"{process.base_url}/health", timeout=30).status_code == 200
