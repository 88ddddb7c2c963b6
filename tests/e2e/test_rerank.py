"""/v1/rerank, /v2/rerank and /score on a real daemon, over plain HTTP with the bodies
Jina, Cohere and vLLM document, for the three rerank methods.

One daemon serves the bundled chat model as an LLM reranker (P("yes")), the bundled
embedding model as a cosine reranker, a tiny random BERT cross-encoder built in the test
(its scores checked against the numpy reference in tests/support/tiny_cross_encoder.py),
and a chat model to be refused. Keys are on, so the root paths' scopes and per-key model
lists are exercised too.
"""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from tokenizers import Tokenizer

from tests.conftest import DaemonProcess, running
from tests.e2e.ops_support import scrape
from tests.support.tiny_cross_encoder import build_cross_encoder, reference_score
from vllm_mlx.config.auth import key_digest

LLM = "llm-reranker"
COSINE = "minilm-reranker"
CROSS = "tiny-cross-encoder"
CHAT = "chat"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "rerank.md"
HELD = Path(__file__).resolve().parents[1] / "fixtures" / "rerank" / "held_queries.json"
ITEMS: list[dict[str, Any]] = json.loads(HELD.read_text())["items"]
APP = "sk-test-rerank-app-1111"
LIMITED = "sk-test-rerank-limited-2222"  # inference, the cosine reranker only
MODELS_ONLY = "sk-test-rerank-models-3333"  # the `models` scope, no inference
ADMIN = "sk-test-rerank-admin-4444"
# The same pair in batches of other widths: float32 sums in another order (the 4-bit
# kernel tiles by batch), so scores agree to about 1e-4, not bit for bit.
ACROSS_BATCHES = 1e-3
QUERY = ITEMS[0]["query"]
DOCUMENTS = ITEMS[0]["documents"]


def _named(name: str, secret: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "key_sha256": key_digest(secret).hex(), **extra}


@pytest.fixture(scope="module")
def cross_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_cross_encoder(tmp_path_factory.mktemp("cross-encoder"))


@pytest.fixture(scope="module")
def daemon(
    tmp_path_factory: pytest.TempPathFactory, model_cache_dir: Path, cross_dir: Path
) -> Iterator[DaemonProcess]:
    base = tmp_path_factory.mktemp("rerank")
    config = {
        "models": [
            {"name": LLM, "source": "builtin:smollm2-135m-instruct", "task": "rerank"},
            {
                "name": COSINE,
                "source": "builtin:all-minilm-l6-v2",
                "task": "rerank",
                "load": "on_demand",
            },
            {"name": CROSS, "source": str(cross_dir), "task": "rerank", "load": "on_demand"},
            {"name": CHAT, "source": "builtin:smollm2-135m-instruct", "load": "on_demand"},
        ],
        "paths": {"state_dir": str(base / "state")},
        "metrics": {"enabled": True},
        "auth": {
            "keys": [
                _named("app", APP),
                _named("limited", LIMITED, models=[COSINE]),
                _named("models-only", MODELS_ONLY, scopes=["models"]),
                _named("ops", ADMIN, scopes=["admin"]),
            ]
        },
    }
    with running(base, model_cache_dir, config) as process:
        yield process


def post(daemon: DaemonProcess, path: str, body: Any, key: str | None = APP) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"{daemon.base_url}{path}", json=body, headers=headers, timeout=300)


def ok(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def test_jina_body(daemon: DaemonProcess) -> None:
    # https://jina.ai/reranker: model, query, documents (strings), top_n, return_documents
    body = {
        "model": LLM,
        "query": QUERY,
        "documents": DOCUMENTS,
        "top_n": 2,
        "return_documents": True,
    }
    done = ok(post(daemon, "/v1/rerank", body))
    results = done["results"]
    assert len(results) == 2
    assert results[0]["relevance_score"] >= results[1]["relevance_score"]
    assert results[0]["index"] == ITEMS[0]["relevant"]
    for result in results:
        assert result["document"] == {"text": DOCUMENTS[result["index"]]}
        assert 0 < result["relevance_score"] < 1
    assert done["model"] == LLM
    assert done["usage"]["total_tokens"] == done["meta"]["tokens"]["input_tokens"] > 0


def test_cohere_bodies(daemon: DaemonProcess) -> None:
    # Cohere v2: documents as strings, no documents back unless asked.
    v2 = ok(
        post(
            daemon, "/v2/rerank", {"model": LLM, "query": QUERY, "documents": DOCUMENTS, "top_n": 3}
        )
    )
    assert [set(r) for r in v2["results"]] == [{"index", "relevance_score"}] * 3
    assert v2["meta"]["api_version"] == {"version": "2"}
    assert v2["meta"]["billed_units"] == {"search_units": 1}
    # Cohere v1: documents as {"text": ...} objects (extra keys ride along).
    objects = [{"text": d, "id": f"doc-{i}"} for i, d in enumerate(DOCUMENTS)]
    v1 = ok(
        post(
            daemon,
            "/v1/rerank",
            {"model": LLM, "query": QUERY, "documents": objects, "return_documents": False},
        )
    )
    assert len(v1["results"]) == len(DOCUMENTS) and "document" not in v1["results"][0]
    # Same pairs, same scores, whichever body carried them.
    by_index = {r["index"]: r["relevance_score"] for r in v1["results"]}
    for result in v2["results"]:
        want = by_index[result["index"]]
        assert result["relevance_score"] == pytest.approx(want, abs=ACROSS_BATCHES)
    scores = [r["relevance_score"] for r in v1["results"]]
    assert scores == sorted(scores, reverse=True)


def test_top_n_above_the_documents_is_clamped(daemon: DaemonProcess) -> None:
    done = ok(
        post(
            daemon,
            "/v1/rerank",
            {"model": LLM, "query": QUERY, "documents": DOCUMENTS[:2], "top_n": 10},
        )
    )
    assert sorted(r["index"] for r in done["results"]) == [0, 1]


def test_score_shapes(daemon: DaemonProcess) -> None:
    one = ok(post(daemon, "/score", {"model": LLM, "text_1": QUERY, "text_2": DOCUMENTS}))
    assert one["object"] == "list" and one["model"] == LLM
    assert [d["index"] for d in one["data"]] == list(range(len(DOCUMENTS)))
    assert {d["object"] for d in one["data"]} == {"score"}
    assert one["usage"]["prompt_tokens"] > 0
    pairwise = ok(
        post(daemon, "/v1/score", {"model": LLM, "text_1": [QUERY, QUERY], "text_2": DOCUMENTS[:2]})
    )
    for a, b in zip(pairwise["data"], one["data"][:2], strict=True):
        assert a["score"] == pytest.approx(b["score"], abs=ACROSS_BATCHES)
    single = ok(post(daemon, "/score", {"model": LLM, "text_1": QUERY, "text_2": DOCUMENTS[1]}))
    assert single["data"][0]["score"] == pytest.approx(one["data"][1]["score"], abs=ACROSS_BATCHES)


# What each method reliably does on the held queries: the 135M chat model is a weak
# judge (margins of a few hundredths; 9 of 10, docs/rerank.md says so), the embedding
# model gets every one of these obvious pairs.
FIRST_AT_LEAST = {LLM: 9, COSINE: 10}


@pytest.mark.parametrize("model", [LLM, COSINE])
def test_held_queries_rank_the_relevant_document_first(daemon: DaemonProcess, model: str) -> None:
    firsts = []
    for item in ITEMS:
        body = {"model": model, "query": item["query"], "documents": item["documents"]}
        done = ok(post(daemon, "/v1/rerank", body))
        firsts.append(done["results"][0]["index"] == item["relevant"])
    assert sum(firsts) >= FIRST_AT_LEAST[model], firsts


def test_the_langchain_example_in_the_docs_runs(daemon: DaemonProcess) -> None:
    text = DOCS.read_text()
    example = text.split("```python\n")[1].split("```")[0]
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        exec(example, {"BASE_URL": daemon.base_url, "API_KEY": APP})
    assert output.getvalue().strip() == "Paris is the capital of France."


def test_cosine_scores_are_cosines(daemon: DaemonProcess) -> None:
    same = ok(
        post(
            daemon,
            "/score",
            {
                "model": COSINE,
                "text_1": "a red apple",
                "text_2": ["a red apple", "quantum chromodynamics"],
            },
        )
    )
    assert same["data"][0]["score"] == pytest.approx(1.0, abs=1e-5)
    assert -1 <= same["data"][1]["score"] < 0.5


def test_cross_encoder_scores_equal_the_reference(daemon: DaemonProcess, cross_dir: Path) -> None:
    done = ok(post(daemon, "/score", {"model": CROSS, "text_1": QUERY, "text_2": DOCUMENTS}))
    tokenizer = Tokenizer.from_file(str(cross_dir / "tokenizer.json"))
    tokenizer.no_padding()
    for item, document in zip(done["data"], DOCUMENTS, strict=True):
        pair = tokenizer.encode(QUERY, document)
        want = reference_score(cross_dir, list(pair.ids), list(pair.type_ids))
        assert item["score"] == pytest.approx(want, abs=1e-5)


def _many(n: int) -> list[str]:
    return [f"document {i}" for i in range(n)]


BAD: list[tuple[str, dict[str, Any], str | None]] = [
    ("/v1/rerank", {"model": LLM, "query": QUERY, "documents": []}, "documents"),
    ("/v1/rerank", {"model": LLM, "query": "", "documents": DOCUMENTS}, "query"),
    ("/v1/rerank", {"model": LLM, "query": "  ", "documents": DOCUMENTS}, "query"),
    ("/v1/rerank", {"model": LLM, "query": QUERY, "documents": ["a", ""]}, "documents[1]"),
    ("/v2/rerank", {"model": LLM, "query": QUERY, "documents": DOCUMENTS, "top_n": 0}, "top_n"),
    ("/v2/rerank", {"model": LLM, "query": QUERY, "documents": DOCUMENTS, "top_n": -2}, "top_n"),
    ("/v1/rerank", {"model": LLM, "query": QUERY, "documents": _many(10_000)}, "documents"),
    ("/v1/rerank", {"model": LLM, "query": QUERY, "documents": "one document"}, None),
    ("/v1/rerank", {"model": LLM, "query": QUERY, "documents": [1, 2]}, None),
    ("/v1/rerank", {"model": LLM, "query": 5, "documents": DOCUMENTS}, None),
    ("/v1/rerank", {"model": LLM, "query": QUERY, "documents": DOCUMENTS, "top_n": "2"}, None),
    ("/v1/rerank", {"model": LLM, "query": QUERY, "documents": [{"title": "no text"}]}, None),
    ("/v1/rerank", {"model": LLM, "documents": DOCUMENTS}, None),
    ("/v1/rerank", {"model": CHAT, "query": QUERY, "documents": DOCUMENTS}, "model"),
    ("/score", {"model": LLM, "text_1": [QUERY, QUERY], "text_2": DOCUMENTS}, "text_2"),
    ("/score", {"model": LLM, "text_1": QUERY, "text_2": []}, "text_2"),
    ("/score", {"model": LLM, "text_1": QUERY, "text_2": _many(10_000)}, "text_2"),
    ("/score", {"model": LLM, "text_1": 3, "text_2": "x"}, None),
]


@pytest.mark.parametrize(("path", "body", "param"), BAD)
def test_bad_input_is_a_400_in_openai_shape(
    daemon: DaemonProcess, path: str, body: dict[str, Any], param: str | None
) -> None:
    response = post(daemon, path, body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    if param is not None:
        assert error["param"] == param


def test_unknown_model_is_a_404(daemon: DaemonProcess) -> None:
    response = post(daemon, "/v1/rerank", {"model": "nope", "query": QUERY, "documents": ["a"]})
    assert response.status_code == 404 and response.json()["error"]["code"] == "model_not_found"


def test_keys_scopes_and_models(daemon: DaemonProcess) -> None:
    rerank = {"model": LLM, "query": QUERY, "documents": DOCUMENTS[:1]}
    pairs = {"model": LLM, "text_1": QUERY, "text_2": "x"}
    for path, body in (("/v2/rerank", rerank), ("/score", pairs), ("/rerank", rerank)):
        assert post(daemon, path, body, key=None).status_code == 401
        refused = post(daemon, path, body, key=MODELS_ONLY)
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "missing_scope"
    limited = post(daemon, "/v1/rerank", rerank, key=LIMITED)
    assert limited.status_code == 403, limited.text
    ok(post(daemon, "/v1/rerank", {**rerank, "model": COSINE}, key=LIMITED))


def test_models_metrics_and_usage(daemon: DaemonProcess) -> None:
    done = ok(
        post(
            daemon, "/v1/rerank", {"model": COSINE, "query": QUERY, "documents": DOCUMENTS}, key=APP
        )
    )
    cards = ok(
        httpx.get(
            f"{daemon.base_url}/v1/models", headers={"Authorization": f"Bearer {APP}"}, timeout=10
        )
    )
    tasks = {card["id"]: card["task"] for card in cards["data"]}
    assert tasks[LLM] == tasks[COSINE] == tasks[CROSS] == "rerank" and tasks[CHAT] == "generate"
    samples = scrape(daemon, {"Authorization": f"Bearer {ADMIN}"})
    label = frozenset({("model_name", COSINE)})
    assert samples[("vllm_mlx_rerank_documents_total", label)] >= len(DOCUMENTS)
    assert samples[("vllm_mlx_rerank_requests_total", label)] >= 1
    usage = ok(
        httpx.get(
            f"{daemon.base_url}/v1/usage",
            params={"key": "app", "model": COSINE},
            headers={"Authorization": f"Bearer {ADMIN}"},
            timeout=30,
        )
    )
    rows = {row["route"]: row for row in usage["data"]}
    assert rows["/v1/rerank"]["prompt_tokens"] >= done["usage"]["prompt_tokens"] > 0


def test_a_reranker_does_not_chat_or_embed(daemon: DaemonProcess) -> None:
    chat = {"model": LLM, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    refused = post(daemon, "/v1/chat/completions", chat)
    assert refused.status_code == 400 and "rerank model" in refused.json()["error"]["message"]
    embed = post(daemon, "/v1/embeddings", {"model": COSINE, "input": "hi"})
    assert embed.status_code == 400 and "does not serve embeddings" in embed.text
