"""A llama layer's decode step, or a short chunk's, in the extension's two layer ops
(models/cpu/decoder.py, kernels/layer.cpp): the same bits as mlx_lm's layer over the
one-node-per-op swaps, and mlx_lm's own path wherever the ops do not compute what the
layer does."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx_lm.models.cache import BatchKVCache, KVCache
from mlx_lm.tuner.lora import LoRALinear

from tests.support.kernel import isas
from tests.support.tiny_model import tiny_llama
from vllm_mlx.models.cpu import attention, decoder, norms, projections, qmm, swiglu
from vllm_mlx.models.lora import LoRAPair, install

BUILT = qmm.status().available and hasattr(qmm.extension(), "decoder_mlp_residual")
pytestmark = pytest.mark.skipif(not BUILT, reason=f"kernel unavailable: {qmm.status().detail}")
LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}


@pytest.fixture(autouse=True)
def fused_on() -> Iterator[None]:
    swapped = attention.uses_kernel(tiny_llama())
    yield
    decoder.use_fused_layers(True)
    if not swapped:
        attention.restore_attention(tiny_llama())


def prepared(
    bits: int = 4, *, int8: bool = False, rope_scaling: dict[str, Any] | None = None, **kw: Any
) -> Any:
    """The tiny llama quantized and swapped as apply_dtype swaps a loaded model."""
    model = tiny_llama(rope_scaling=rope_scaling)
    predicate = kw.get("class_predicate")
    if predicate is not None:
        nn.quantize(model, group_size=32, bits=8, class_predicate=predicate)
    nn.quantize(model, group_size=32, bits=bits)
    qmm.swap_layers(model, int8_activations=int8)
    projections.group_projections(model)
    swiglu.swap_activations(model)
    norms.swap_norms(model)
    attention.swap_attention(model)
    return model


def decode(model: Any, prompt: mx.array, steps: int, cache: list[Any]) -> tuple[mx.array, ...]:
    """Greedy steps after the prompt; every step's logits."""
    logits = model(prompt, cache=cache)
    seen = []
    for _ in range(steps):
        token = mx.argmax(logits[:, -1, :], axis=-1)[:, None]
        logits = model(token, cache=cache)
        seen.append(logits)
    mx.eval(seen)
    return tuple(seen)


def same_steps(model: Any, prompt: mx.array, make_cache: Any, steps: int = 6) -> bool:
    decoder.use_fused_layers(True)
    fused = decode(model, prompt, steps, make_cache())
    decoder.use_fused_layers(False)
    plain = decode(model, prompt, steps, make_cache())
    decoder.use_fused_layers(True)
    return all(mx.array_equal(a, b).item() for a, b in zip(fused, plain, strict=True))


def kv_caches(model: Any) -> list[Any]:
    return [KVCache() for _ in model.layers]


PROMPT = mx.array([[5, 9, 12, 40, 3], [7, 7, 1, 2, 60], [90, 4, 33, 8, 21]])


@pytest.mark.parametrize("isa", isas())
@pytest.mark.parametrize("bits", [4, 8])
def test_a_fused_layer_has_the_bits_of_the_layer(isa: str, bits: int, threaded: None) -> None:
    qmm.extension().set_isa(isa)
    try:
        model = prepared(bits)
        assert decoder.swap_decoder_layers(model) == len(model.layers)
        assert decoder.uses_fused_layers(model)
        assert same_steps(model, PROMPT, lambda: kv_caches(model))
    finally:
        qmm.extension().set_isa("best")


def test_llama3_rope_and_int8_activations() -> None:
    model = prepared(rope_scaling=LLAMA3, int8=qmm.extension().int8_available())
    assert type(model.layers[0].self_attn.rope) is norms.FusedLlama3RoPE
    assert decoder.swap_decoder_layers(model) == len(model.layers)
    assert same_steps(model, PROMPT, lambda: kv_caches(model))


def test_a_left_padded_batch_with_its_mask() -> None:
    """The engine's batch cache: rows of different lengths, left padding, a bool mask."""
    model = prepared()
    assert decoder.swap_decoder_layers(model) == len(model.layers)
    padded = mx.array([[0, 0, 12, 40, 3], [7, 7, 1, 2, 60], [0, 4, 33, 8, 21]])
    caches = lambda: [BatchKVCache(left_padding=[2, 0, 1]) for _ in model.layers]  # noqa: E731
    assert same_steps(model, padded, caches)


def test_projections_quantized_apart_keep_their_own_quantization() -> None:
    """o and down at 8 bits beside 4-bit q/k/v and gate/up: each op takes each product's."""
    model = prepared(class_predicate=lambda path, _: path.endswith(("o_proj", "down_proj")))
    assert model.layers[0].self_attn.o_proj.bits == 8
    assert decoder.swap_decoder_layers(model) == len(model.layers)
    assert same_steps(model, PROMPT, lambda: kv_caches(model))


def test_a_layer_the_ops_do_not_compute_keeps_mlx_lms_path() -> None:
    """q/k/v in two quantizations is not one grouped product: no swap, same outputs."""
    model = prepared(class_predicate=lambda path, _: path.endswith("v_proj"))
    assert decoder.swap_decoder_layers(model) == 0
    assert not decoder.uses_fused_layers(model)


def test_a_layer_whose_projections_differ_in_int8_keeps_mlx_lms_path() -> None:
    """Each op takes one int8 flag: a layer whose o product alone asks for int8 is not
    fused (one the extension's int8 tiles would change), the other layer is."""
    model = prepared()
    model.layers[0].self_attn.o_proj.int8_activations = True
    assert decoder.swap_decoder_layers(model) == 1
    assert type(model.layers[0]) is not decoder.FusedTransformerBlock
    assert model.layers[1].plan() is not None
    assert same_steps(model, PROMPT, lambda: kv_caches(model))


def test_an_adapter_installed_later_takes_mlx_lms_path() -> None:
    """A LoRA bank changes q_proj's class: the layer's plan no longer holds, and the step
    adds the adapter's delta exactly as mlx_lm's layer does."""
    model = prepared()
    decoder.swap_decoder_layers(model)
    decode(model, PROMPT, 1, kv_caches(model))  # the plans are made
    assert all(layer.plan() is not None for layer in model.layers)
    pair = LoRAPair(
        a=mx.random.normal((64, 4), key=mx.random.key(1)),
        b=mx.random.normal((4, 64), key=mx.random.key(2)),
        scale=2.0,
    )
    install(model, "tag", {f"model.layers.{i}.self_attn.q_proj": pair for i in range(2)})
    with_adapter = decode(model, PROMPT, 3, kv_caches(model))
    assert all(layer.plan() is None for layer in model.layers)
    decoder.use_fused_layers(False)
    plain = decode(model, PROMPT, 3, kv_caches(model))
    assert all(mx.array_equal(a, b).item() for a, b in zip(with_adapter, plain, strict=True))


def test_a_layer_wrapped_after_its_plan_was_made_takes_the_wrapper() -> None:
    """mlx_lm's LoRALinear replaces the projection (the layer object stays as it was):
    the plan made before no longer holds (the load-time probe makes one, so this is
    what `mlx_lm.tuner.utils.load_adapters` after loading does)."""
    model = prepared()
    decoder.swap_decoder_layers(model)
    decode(model, PROMPT, 1, kv_caches(model))
    attn = model.layers[1].self_attn
    attn.q_proj = LoRALinear.from_base(attn.q_proj, r=4, scale=5.0)
    attn.q_proj.lora_b = mx.random.normal(attn.q_proj.lora_b.shape, key=mx.random.key(3))
    assert model.layers[0].plan() is not None and model.layers[1].plan() is None
    assert same_steps(model, PROMPT, lambda: kv_caches(model))
    fused = decode(model, PROMPT, 2, kv_caches(model))
    attn.q_proj.lora_b = mx.zeros(attn.q_proj.lora_b.shape)  # the adapter's delta matters
    assert not mx.array_equal(fused[-1], decode(model, PROMPT, 2, kv_caches(model))[-1]).item()


def test_new_weights_make_a_new_plan() -> None:
    model = prepared()
    decoder.swap_decoder_layers(model)
    decode(model, PROMPT, 1, kv_caches(model))
    before = model.layers[0].plan()
    norm = model.layers[0].post_attention_layernorm
    norm.weight = norm.weight * 2
    after = model.layers[0].plan()
    assert after is not None and after is not before
    assert same_steps(model, PROMPT, lambda: kv_caches(model))


def test_a_chunk_of_positions_keeps_the_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    """A prompt's chunk (several positions a row, after earlier ones) takes the two ops,
    with the bits of mlx_lm's layer."""
    model = prepared()
    decoder.swap_decoder_layers(model)
    fused_calls = []
    real = decoder._decode
    monkeypatch.setattr(decoder, "_decode", lambda *a: fused_calls.append(1) or real(*a))

    def chunks(cache: list[Any]) -> list[mx.array]:
        return [model(PROMPT, cache=cache), model(PROMPT[:, :3] + 1, cache=cache)]

    fused = chunks(kv_caches(model))
    assert len(fused_calls) == 2 * len(model.layers)
    decoder.use_fused_layers(False)
    plain = chunks(kv_caches(model))
    assert all(mx.array_equal(a, b).item() for a, b in zip(fused, plain, strict=True))


def test_a_chunk_past_the_kernels_rows_takes_mlx_lms_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past qmm.max_rows() the projections take dequantize + BLAS: mlx_lm's path, whose
    bits those are."""
    model = prepared()
    decoder.swap_decoder_layers(model)
    monkeypatch.setattr(qmm, "_max_rows", PROMPT.size - 1)
    monkeypatch.setattr(decoder, "_decode", lambda *a: pytest.fail("took the fused path"))
    mx.eval(model(PROMPT, cache=kv_caches(model)))
    monkeypatch.setattr(qmm, "_max_rows", PROMPT.size)
    with pytest.raises(pytest.fail.Exception):
        model(PROMPT, cache=kv_caches(model))


def weights(n: int, k: int, seed: int) -> list[mx.array]:
    return list(mx.quantize(mx.random.normal((n, k), key=mx.random.key(seed)), 32, 4))


def test_the_ops_refuse_what_they_cannot_compute() -> None:
    ext = qmm.extension()
    x, norm = mx.zeros((2, 1, 64)), mx.ones((64,))
    qkv = weights(64, 64, 1) + weights(32, 64, 2) + weights(32, 64, 3)
    offset = mx.array(3)

    def inputs(**kw: Any) -> Any:
        args: dict[str, Any] = dict(
            x=x, norm_weight=norm, eps=1e-5, qkv=qkv, group_size=32, bits=4, int8=False,
            n_heads=4, n_kv_heads=2, head_dim=16, rope_dims=16, traditional=False,
            base=10000.0, rope_scale=1.0, offset=offset,
        )  # fmt: skip
        args.update(kw)
        return ext.decoder_attention_inputs(**args)

    q, k, v = inputs()
    assert (q.shape, k.shape, v.shape) == ((2, 4, 1, 16), (2, 2, 1, 16), (2, 2, 1, 16))
    chunk = inputs(x=mx.zeros((2, 3, 64)))
    assert [a.shape for a in chunk] == [(2, 4, 3, 16), (2, 2, 3, 16), (2, 2, 3, 16)]
    for bad, match in [
        ({"x": mx.zeros((2, 64))}, "shape \\(batch, positions, hidden\\)"),
        ({"x": mx.zeros((2, 0, 64))}, "shape \\(batch, positions, hidden\\)"),
        ({"x": mx.zeros((2, 1, 64), dtype=mx.float16)}, "must be float32"),
        ({"norm_weight": mx.ones((63,))}, "norm weight"),
        ({"qkv": qkv[:6]}, "expected 3 projections"),
        ({"n_heads": 5}, "n_heads \\* head_dim"),
        ({"rope_dims": 17}, "rope dims"),
        ({"offset": mx.array([1, 2, 3])}, "one integer per batch row"),
        ({"base": None}, "exactly one of base and freqs"),
        ({"bits": 3}, "has no kernel"),
        ({"eps": 0.0}, "eps must be positive"),
    ]:
        with pytest.raises(ValueError, match=match):
            inputs(**bad)
    o, gate_up, down = (
        weights(64, 64, 4),
        weights(96, 64, 5) + weights(96, 64, 6),
        weights(64, 96, 7),
    )

    def outputs(**kw: Any) -> Any:
        args: dict[str, Any] = dict(
            attention=q, x=x, o=o, o_quantization=(32, 4), norm_weight=norm, eps=1e-5,
            gate_up=gate_up, gate_up_quantization=(32, 4), down=down,
            down_quantization=(32, 4), int8=False,
        )  # fmt: skip
        args.update(kw)
        return ext.decoder_mlp_residual(**args)

    assert outputs().shape == (2, 1, 64)
    for bad, match in [
        ({"attention": mx.zeros((3, 4, 1, 16))}, "x's batch"),
        ({"attention": mx.zeros((2, 4, 3, 16))}, "x's batch and positions"),
        ({"o": weights(64, 32, 8)}, "last dimension must be 32"),
        ({"gate_up": gate_up[:3] + weights(80, 64, 9)}, "as many outputs"),
        ({"down": weights(32, 96, 10)}, "down's outputs"),
        ({"down_quantization": (48, 4)}, "has no kernel"),
    ]:
        with pytest.raises(ValueError, match=match):
            outputs(**bad)


def test_the_bundled_model_loads_with_fused_layers(model_cache_dir: Path) -> None:
    """apply_dtype swaps every layer of the bundled model; its greedy steps keep their bits."""
    from vllm_mlx.config.model import ModelSettings
    from vllm_mlx.models.loader import load_model

    loaded = load_model(
        ModelSettings(name="smol", source="builtin:smollm2-135m-instruct"), model_cache_dir
    )
    model = loaded.model
    assert sum(type(m) is decoder.FusedTransformerBlock for _, m in model.named_modules()) == 30
    prompt = mx.array([[1, 504, 3458, 314, 4932, 30]])
    assert same_steps(model, prompt, lambda: [KVCache() for _ in model.layers], steps=4)
