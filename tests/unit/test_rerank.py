"""Rerank logic without a model: pairing, sorting and top_n, input checks, the method
chosen from a model's files, pair encoding grouped by query."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_mlx.api.errors import APIError
from vllm_mlx.api.rerank.routes import ranked_results, score_pairs_of
from vllm_mlx.api.rerank.schema import ScoreRequest
from vllm_mlx.api.rerank.scoring import check_query, check_texts, cosines, pair_tokens
from vllm_mlx.models.rerank import rerank_method_of


def test_score_pairs_broadcast_and_pairwise() -> None:
    one = ScoreRequest(model="m", text_1="q", text_2=["a", "b"])
    assert score_pairs_of(one, 10) == [("q", "a"), ("q", "b")]
    both = ScoreRequest(model="m", text_1=["q1", "q2"], text_2=["a", "b"])
    assert score_pairs_of(both, 10) == [("q1", "a"), ("q2", "b")]
    single = ScoreRequest(model="m", text_1="q", text_2="a")
    assert score_pairs_of(single, 10) == [("q", "a")]
    with pytest.raises(APIError, match="same length"):
        score_pairs_of(ScoreRequest(model="m", text_1=["a", "b"], text_2=["c"] * 3), 10)
    with pytest.raises(APIError, match="at most 2"):
        score_pairs_of(ScoreRequest(model="m", text_1="q", text_2=["a", "b", "c"]), 2)


def test_results_sorted_cut_and_with_documents() -> None:
    texts = ["a", "b", "c"]
    got = ranked_results([0.1, 0.9, 0.5], texts, 2, True)
    assert [r["index"] for r in got] == [1, 2]
    assert got[0]["document"] == {"text": "b"}
    plain = ranked_results([0.5, 0.5, 0.7], texts, None, False)
    assert [r["index"] for r in plain] == [2, 0, 1]  # ties keep request order
    assert "document" not in plain[0]
    assert len(ranked_results([0.1, 0.2], texts[:2], 50, False)) == 2  # top_n above: clamped


@pytest.mark.parametrize(
    ("texts", "param"),
    [([], "documents"), (["a", " "], "documents[1]"), (["x"] * 4, "documents")],
)
def test_bad_documents_name_the_field(texts: list[str], param: str) -> None:
    with pytest.raises(APIError) as caught:
        check_texts(texts, "documents", 3)
    assert caught.value.status == 400 and caught.value.param == param


def test_empty_query() -> None:
    with pytest.raises(APIError):
        check_query("\n ")
    check_query("q")


def test_method_from_files(tmp_path: Path) -> None:
    def folder(name: str, config: dict[str, object], *files: str) -> Path:
        path = tmp_path / name
        path.mkdir()
        (path / "config.json").write_text(json.dumps(config))
        for file in files:
            (path / file).write_text("[]")
        return path

    cross = folder("ce", {"model_type": "bert", "architectures": ["BertForSequenceClassification"]})
    assert rerank_method_of(cross, None) == "cross_encoder"
    assert rerank_method_of(folder("st", {"model_type": "bert"}), None) == "embedding"
    assert rerank_method_of(folder("mj", {"model_type": "mpnet"}, "modules.json"), None) == (
        "embedding"
    )
    assert rerank_method_of(folder("lm", {"architectures": ["LlamaForCausalLM"]}), None) == "llm"
    assert rerank_method_of(cross, "embedding") == "embedding"  # the key wins


class _Encoder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, list[str]]] = []

    def encode_pairs(self, query: str, documents: list[str]) -> list[list[int]]:
        self.calls.append((query, documents))
        return [[len(query), len(d)] for d in documents]


def test_pair_tokens_group_runs_of_one_query() -> None:
    encoder = _Encoder()
    pairs = [("q", "a"), ("q", "bb"), ("qq", "c"), ("q", "d")]
    assert pair_tokens(encoder, pairs) == [[1, 1], [1, 2], [2, 1], [1, 1]]
    assert encoder.calls == [("q", ["a", "bb"]), ("qq", ["c"]), ("q", ["d"])]


def test_cosines_normalise() -> None:
    scores = cosines([[2.0, 0.0], [1.0, 1.0], [0.0, -3.0]], [(0, 1), (0, 2), (1, 1)])
    assert scores == pytest.approx([2**-0.5, 0.0, 1.0])


class _CharTokenizer:
    """One token per character; a chat template that wraps the turns in brackets."""

    def apply_chat_template(self, messages: list[dict[str, str]], **_: object) -> str:
        return "".join(f"[{m['content']}]" for m in messages) + "A:"

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]


def test_llm_pairs_fit_the_context_by_cutting_query_then_document() -> None:
    from vllm_mlx.models.llm_scorer import SYSTEM, LlmPairs, answer_tokens

    tokenizer = _CharTokenizer()
    fixed = len(f"[{SYSTEM}][Question: \nDocument: \nIs the document relevant to the question?]A:")
    pairs = LlmPairs(tokenizer, fixed + 10)
    assert pairs.room == 10
    # "#" and "%" appear nowhere in the template: they count the query's and document's.
    short, long_doc = pairs.encode_pairs("##", ["%%", "%" * 50])
    (long_both,) = pairs.encode_pairs("#" * 30, ["%%%%"])
    assert "".join(map(chr, short)).count("#") == 2 and len(short) == fixed + 4
    cut = "".join(map(chr, long_doc))
    assert cut.count("%") == 8 and len(long_doc) == fixed + 10  # the document takes the rest
    both = "".join(map(chr, long_both))
    assert both.count("#") == 5 and both.count("%") == 4  # the query gets half the room
    assert answer_tokens(tokenizer, ("yes", "Y", "y")) == [ord("Y"), ord("y")]
