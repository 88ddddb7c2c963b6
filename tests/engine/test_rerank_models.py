"""Rerank models in MLX: the BERT cross-encoder against a float64 reference, the LLM
scorer batched against one pair at a time, and the method chosen from a model's files.

The cross-encoder reference (tests/support/tiny_cross_encoder.py) is transformers'
BertForSequenceClassification forward written in numpy, plus the sigmoid that
sentence-transformers' CrossEncoder applies to one logit: torch and sentence-transformers
are not installed here, so they cannot be run themselves.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from tests.support.tiny_cross_encoder import build_cross_encoder, reference_score
from vllm_mlx.config.model import ModelSettings
from vllm_mlx.models.cross_encoder import segments
from vllm_mlx.models.loaded import LoadedEmbeddingModel
from vllm_mlx.models.loader import load_model
from vllm_mlx.models.rerank import rerank_method_of
from vllm_mlx.models.sources import builtin_path

QUERY = "what is the capital of france?"
DOCUMENTS = [
    "Paris is the capital and largest city of France.",
    "bananas",
    "The Great Wall of China is very long and was built over many centuries " * 4,
]
# float32 MLX against float64 numpy, through two random layers: scores agree far
# closer than any ranking needs.
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_cross_encoder(tmp_path_factory.mktemp("cross-encoder"))


@pytest.fixture(scope="module")
def cross_encoder(tiny_dir: Path, model_cache_dir: Path) -> LoadedEmbeddingModel:
    settings = ModelSettings(name="ce", source=str(tiny_dir), task="rerank")
    loaded = load_model(settings, model_cache_dir)
    assert isinstance(loaded, LoadedEmbeddingModel)
    return loaded


def test_cross_encoder_is_chosen_from_the_architecture(tiny_dir: Path) -> None:
    assert rerank_method_of(tiny_dir, None) == "cross_encoder"
    assert rerank_method_of(builtin_path("all-minilm-l6-v2"), None) == "embedding"
    assert rerank_method_of(tiny_dir, "llm") == "llm"


def test_cross_encoder_scores_equal_the_reference(
    cross_encoder: LoadedEmbeddingModel, tiny_dir: Path
) -> None:
    assert cross_encoder.rerank_method == "cross_encoder" and cross_encoder.pairs is not None
    tokens = cross_encoder.pairs.encode_pairs(QUERY, DOCUMENTS)
    # The pair as transformers tokenizes it: its template, its segments, cut to 64.
    reference = Tokenizer.from_file(str(tiny_dir / "tokenizer.json"))
    reference.no_padding()
    reference.enable_truncation(64, strategy="longest_first")
    encoded = [reference.encode(QUERY, d) for d in DOCUMENTS]
    assert tokens == [list(e.ids) for e in encoded]
    assert len(tokens[2]) == 64  # the long document was cut to max_position_embeddings
    sep = reference.token_to_id("[SEP]")
    for e in encoded:
        assert segments(np.array([e.ids]), sep)[0].tolist() == list(e.type_ids)
    want = [reference_score(tiny_dir, list(e.ids), list(e.type_ids)) for e in encoded]
    got = cross_encoder.embedder.embed(tokens)  # one padded batch
    np.testing.assert_allclose(np.asarray(got, dtype=np.float64), want, atol=TOLERANCE)
    assert len({round(w, 4) for w in want}) == 3  # random weights still tell them apart


def test_a_multi_label_classifier_is_refused(tiny_dir: Path, tmp_path: Path,
                                             model_cache_dir: Path) -> None:  # fmt: skip
    other = build_cross_encoder(tmp_path / "two")
    config = json.loads((other / "config.json").read_text())
    config["id2label"] = {"0": "no", "1": "yes"}
    (other / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="2 labels"):
        load_model(ModelSettings(name="x", source=str(other), task="rerank"), model_cache_dir)


def test_llm_scores_batched_equal_one_at_a_time(model_cache_dir: Path) -> None:
    settings = ModelSettings(name="r", source="builtin:smollm2-135m-instruct", task="rerank")
    loaded = load_model(settings, model_cache_dir)
    assert isinstance(loaded, LoadedEmbeddingModel) and loaded.pairs is not None
    assert loaded.rerank_method == "llm"
    tokens = loaded.pairs.encode_pairs(QUERY, DOCUMENTS)
    assert len({len(t) for t in tokens}) == 3  # different lengths: the batch pads
    batched = np.asarray(loaded.embedder.embed(tokens))
    single = np.array([loaded.embedder.embed([t])[0] for t in tokens])
    np.testing.assert_allclose(batched, single, atol=1e-4)
    assert ((batched > 0) & (batched < 1)).all()
