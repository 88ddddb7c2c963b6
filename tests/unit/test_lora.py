"""LoRA pairs beside a base model against mlx-lm's own adapter loading, on a tiny random
llama (float and 4-bit), alone and with rows of other adapters in one batch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from mlx.nn.layers.quantized import quantize
from mlx.utils import tree_flatten
from mlx_lm.models import llama
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.tuner.utils import linear_to_lora_layers, load_adapters

from vllm_mlx.engine.cache.rows import BatchKVCache
from vllm_mlx.models import lora
from vllm_mlx.models.adapters import AdapterError, adapter_pairs, check_adapter_dir

SHAPE: dict[str, Any] = {
    "model_type": "llama",
    "hidden_size": 64,
    "num_hidden_layers": 3,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5,
    "vocab_size": 256,
}
ARGS = llama.ModelArgs(**SHAPE)
PROMPT = [3, 17, 42, 99, 7, 250, 1]


def base_model(quantized: bool) -> llama.Model:
    mx.random.seed(0)
    model = llama.Model(ARGS)
    if quantized:
        quantize(model, group_size=32, bits=4)
    mx.eval(model.parameters())
    return model


def write_adapter(
    directory: Path, seed: int, rank: int = 4, num_layers: int = 2, quantized: bool = False
) -> Path:
    """An adapter as mlx_lm.lora saves one: random non-zero pairs, its config."""
    model = base_model(quantized)
    params = {"rank": rank, "scale": 10.0, "dropout": 0.0}
    linear_to_lora_layers(model, num_layers, params)
    mx.random.seed(seed)
    weights = {
        name: mx.random.normal(value.shape) * 0.2
        for name, value in flat(model)
        if name.endswith(("lora_a", "lora_b"))
    }
    directory.mkdir(parents=True)
    mx.save_safetensors(str(directory / "adapters.safetensors"), weights)
    config = {"fine_tune_type": "lora", "num_layers": num_layers, "lora_parameters": params}
    (directory / "adapter_config.json").write_text(json.dumps(config))
    return directory


def flat(model: Any) -> list[tuple[str, Any]]:
    return tree_flatten(model.parameters())  # type: ignore[return-value]


def reference_logits(quantized: bool, adapter: Path | None) -> np.ndarray:
    model = base_model(quantized)
    if adapter is not None:
        load_adapters(model, str(adapter))  # what mlx_lm.load(..., adapter_path=) does
    model.eval()
    out = model(mx.array([PROMPT]), cache=make_prompt_cache(model))
    return np.array(out[0])


@pytest.mark.parametrize("quantized", [False, True])
def test_rows_of_two_adapters_and_the_base_match_mlx_lm_alone(
    tmp_path: Path, quantized: bool
) -> None:
    first = write_adapter(tmp_path / "a", seed=1, quantized=quantized)
    second = write_adapter(tmp_path / "b", seed=2, rank=2, num_layers=3, quantized=quantized)
    model = base_model(quantized)
    lora.install(model, "a", adapter_pairs(model, first))
    lora.install(model, "b", adapter_pairs(model, second))
    tags = ["a", None, "b", "a"]
    cache = [BatchKVCache([0] * len(tags), tags) for _ in model.layers]
    got = np.array(model(mx.array([PROMPT] * len(tags)), cache=cache))
    want = {
        tag: reference_logits(quantized, path)
        for tag, path in (("a", first), (None, None), ("b", second))
    }
    for row, tag in enumerate(tags):
        np.testing.assert_array_equal(got[row], want[tag])
    assert not np.array_equal(want["a"], want[None])  # the adapters do change the output


def test_a_batch_of_one_adapter_and_untagged_passes(tmp_path: Path) -> None:
    path = write_adapter(tmp_path / "a", seed=1)
    model = base_model(False)
    router = lora.router_of(model)
    lora.install(model, "a", adapter_pairs(model, path))
    cache = [BatchKVCache([0, 0], ["a", "a"]) for _ in model.layers]
    got = np.array(model(mx.array([PROMPT] * 2), cache=cache))
    want = reference_logits(False, path)
    np.testing.assert_array_equal(got[0], want)
    np.testing.assert_array_equal(got[1], want)
    # A pass without tags runs the router's default: the base, unless set.
    plain = np.array(model(mx.array([PROMPT]), cache=make_prompt_cache(model))[0])
    np.testing.assert_array_equal(plain, reference_logits(False, None))
    with router.defaulting("a"):
        routed = np.array(model(mx.array([PROMPT]), cache=make_prompt_cache(model))[0])
    np.testing.assert_array_equal(routed, want)


def test_uninstall_restores_the_base_output(tmp_path: Path) -> None:
    path = write_adapter(tmp_path / "a", seed=1)
    model = base_model(False)
    names = [name for name, _ in flat(model)]
    lora.install(model, "a", adapter_pairs(model, path))
    assert [name for name, _ in flat(model)] == names  # no new params
    assert lora.installed(model) == {"a"}
    lora.uninstall(model, "a")
    assert lora.installed(model) == set()
    cache = [BatchKVCache([0], ["a"]) for _ in model.layers]
    got = np.array(model(mx.array([PROMPT]), cache=cache)[0])
    np.testing.assert_array_equal(got, reference_logits(False, None))


def _edit_config(path: Path, **changes: Any) -> None:
    config = json.loads((path / "adapter_config.json").read_text())
    config.update(changes)
    (path / "adapter_config.json").write_text(json.dumps(config))


def test_bad_adapters_are_refused_with_the_reason(tmp_path: Path) -> None:
    with pytest.raises(AdapterError, match="does not exist"):
        check_adapter_dir(tmp_path / "missing")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(AdapterError, match=r"adapter_config\.json does not exist"):
        check_adapter_dir(empty)
    wrong_rank = write_adapter(tmp_path / "rank", seed=1)
    _edit_config(wrong_rank, lora_parameters={"rank": 8, "scale": 10.0, "dropout": 0.0})
    with pytest.raises(AdapterError, match="not rank 8"):
        check_adapter_dir(wrong_rank)
    dora = write_adapter(tmp_path / "dora", seed=1)
    _edit_config(dora, fine_tune_type="dora")
    with pytest.raises(AdapterError, match="dora"):
        check_adapter_dir(dora)
    (dora / "adapter_config.json").write_text("{not json")
    with pytest.raises(AdapterError, match="not readable JSON"):
        check_adapter_dir(dora)


def test_an_adapter_for_another_shape_does_not_fit(tmp_path: Path) -> None:
    path = write_adapter(tmp_path / "a", seed=1, num_layers=3)
    wider = llama.Model(llama.ModelArgs(**{**SHAPE, "hidden_size": 96}))
    with pytest.raises(AdapterError, match="does not match model parameter shape"):
        adapter_pairs(wider, path)
    shallow = llama.Model(llama.ModelArgs(**{**SHAPE, "num_hidden_layers": 2}))
    with pytest.raises(AdapterError, match="not an adapter parameter in the model"):
        adapter_pairs(shallow, path)
