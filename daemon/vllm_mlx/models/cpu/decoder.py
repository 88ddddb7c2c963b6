"""A Llama decoder layer's decode step in three of the extension's nodes on the CPU.

After the other swaps in this package a decode step of the bundled model is still ~25
graph nodes a layer (two norms, the grouped q/k/v and gate/up products, four reshapes
and four transposes, two rotary embeddings, the o and down products, SwiGLU, two
residual adds, the cache update, attention), and at one stream a node's bookkeeping and
its Python costs more than its arithmetic (docs/benchmarks.md, round 12). At one query
position per row, `decoder_attention_inputs` computes the norm, q/k/v and the rotary
embedding in one node, and `decoder_mlp_residual` the o product, both residual adds, the
second norm and the MLP in another; in between, `sdpa_decode_append` writes the step's K
and V into the cache's buffers in place and attends over them in a third (the bits of
mlx_lm's update_and_fetch and attention.py's decode call, without their four slice
nodes a layer: 120 of a step's 249 nodes), where the cache is mlx_lm's plain KVCache or
the engine's batch cache and has room; elsewhere mlx_lm's cache and attention.py's
routing run as they are. Inside, the ops call the row functions of the one-node-per-op
path in the same order (kernels/layer.h), so outputs keep their bits: a load-time probe
compares a swapped layer with mlx_lm's on random inputs and keeps mlx_lm's path if a
single bit differs.

Only mlx_lm's `llama.TransformerBlock` is swapped (Llama, SmolLM, Mistral-style
checkpoints load as it), and a call takes the fused path only while the layer is what
the ops compute: float32, the kernel's quantized projections without biases or LoRA
banks (whose class differs), the extension's norms, rotary embedding and SwiGLU.
Anything else (an adapter installed later) runs mlx_lm's own `__call__`.

A call with several positions a row (a prompt's chunk that prefill pacing sizes beside
decoding streams, a speculative draft's check) takes the same two ops while its rows
stay within the kernel's (`qmm.max_rows()`; a longer chunk's projections take
dequantize + BLAS in mlx_lm's path, other bits), with mlx_lm's cache update and
attention.py's routing between them: ~25 nodes a layer fewer. A 4-token chunk after 256
positions took 20.2 ms against 24.0 ms, after 4,096 42.4 against 48.3 ms
(docs/benchmarks.md, round 22).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from operator import is_
from typing import Any

import mlx.core as mx
from mlx_lm.models import llama
from mlx_lm.models.cache import KVCache

from vllm_mlx.models.cpu import attention, norms, qmm, swiglu
from vllm_mlx.models.cpu.probe import same_bits

_ORIGINAL_CALL = llama.TransformerBlock.__call__
# The model module, whose `scaled_dot_product_attention` global attention.py swaps.
_LLAMA: Any = llama
_CAUSAL: Any = "causal"  # mlx_lm's mask for a prompt (its annotation says array)
_enabled = True  # benchmarks and tests compare both paths in one process
_append = True  # the cache update inside the attention node (sdpa_decode_append)


def use_fused_layers(on: bool) -> None:
    global _enabled
    _enabled = on


def use_appended_attention(on: bool) -> None:
    global _append
    _append = on


def _triple(layer: Any) -> list[mx.array]:
    return [layer["weight"], layer["scales"], layer["biases"]]


def _same_quantization(layers: tuple[Any, ...]) -> bool:
    first = layers[0]
    return all(
        type(layer) is qmm.KernelQuantizedLinear
        and "bias" not in layer
        and layer.group_size == first.group_size
        and layer.bits == first.bits
        and layer.int8_activations == first.int8_activations
        and layer["scales"].dtype == first["scales"].dtype
        for layer in layers
    )


def _fusable(block: Any) -> bool:
    attn, mlp = block.self_attn, block.mlp
    return (
        mx.default_device().type == mx.DeviceType.cpu  # the ops run on the CPU only
        and type(attn) is llama.Attention
        and type(mlp) in swiglu.fused_classes()
        and type(block.input_layernorm) is norms.FusedRMSNorm
        and type(block.post_attention_layernorm) is norms.FusedRMSNorm
        and type(attn.rope) in (norms.FusedRoPE, norms.FusedLlama3RoPE)
        and _same_quantization((attn.q_proj, attn.k_proj, attn.v_proj))
        and _same_quantization((mlp.gate_proj, mlp.up_proj))
        and _same_quantization((attn.o_proj,))
        and _same_quantization((mlp.down_proj,))
        # One int8 choice for all seven: each op takes a single flag.
        and attn.q_proj.int8_activations
        == attn.o_proj.int8_activations
        == mlp.gate_proj.int8_activations
        == mlp.down_proj.int8_activations
    )


@dataclass(frozen=True)
class _Plan:
    """A layer's arguments to the two ops, gathered once. What the loader sets once per
    layer (group size, bits, `int8_activations`, head counts) is read here only."""

    inputs: tuple[Any, ...]  # decoder_attention_inputs' arguments after x
    llama3_freqs: mx.array | None
    outputs: tuple[Any, ...]  # decoder_mlp_residual's arguments after attention and x
    scale: float


def _parts(block: Any) -> tuple[Any, ...]:
    """Every module a plan is made of, each one's class, and its weights: a plan holds
    while this is the same tuple by identity. A LoRA bank changes its layer's class,
    mlx_lm's LoRALinear replaces the layer, new weights replace arrays (a module's
    scales and biases are replaced with its weight: quantizing writes all three).
    Children and parameters are the module's dict items, read as such, without
    nn.Module's __getattr__: this runs for every layer of every step (~4 us)."""
    get: Any = dict.get
    attn, mlp = get(block, "self_attn"), get(block, "mlp")
    norm1, norm2 = get(block, "input_layernorm"), get(block, "post_attention_layernorm")
    rope = get(attn, "rope")
    q, k, v, o = get(attn, "q_proj"), get(attn, "k_proj"), get(attn, "v_proj"), get(attn, "o_proj")
    gate, up, down = get(mlp, "gate_proj"), get(mlp, "up_proj"), get(mlp, "down_proj")
    members = (norm1, norm2, q, k, v, o, gate, up, down)
    return (
        attn,
        mlp,
        rope,
        *members,
        type(mlp),
        type(rope),
        *map(type, members),
        *(get(m, "weight") if isinstance(m, dict) else None for m in members),
    )


def _plan(block: Any) -> _Plan:
    attn, mlp = block.self_attn, block.mlp
    rope, q_proj = attn.rope, attn.q_proj
    o, gate, up, down = attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj
    llama3 = type(rope) is norms.FusedLlama3RoPE
    return _Plan(
        inputs=(
            block.input_layernorm["weight"],
            block.input_layernorm.eps,
            _triple(q_proj) + _triple(attn.k_proj) + _triple(attn.v_proj),
            q_proj.group_size,
            q_proj.bits,
            q_proj.int8_activations,
            attn.n_heads,
            attn.n_kv_heads,
            attn.head_dim,
            rope.dims,
            rope.traditional,
            None if llama3 else rope.base,
            1.0 if llama3 else rope.scale,
        ),
        llama3_freqs=rope._freqs if llama3 else None,
        outputs=(
            _triple(o),
            (o.group_size, o.bits),
            block.post_attention_layernorm["weight"],
            block.post_attention_layernorm.eps,
            _triple(gate) + _triple(up),
            (gate.group_size, gate.bits),
            _triple(down),
            (down.group_size, down.bits),
            o.int8_activations,
        ),
        scale=attn.scale,
    )


def _append_slot(cache: Any) -> int | None:
    """Where this step's K and V go in the cache's float32 buffers, if one node may write
    them there in place: the engine's caches say (`decode_slot`), mlx_lm's plain KVCache
    while its buffer has room. None: mlx_lm's update_and_fetch runs (no buffer yet, a
    full one to grow, a quantized cache)."""
    slot = getattr(cache, "decode_slot", None)
    if slot is not None:
        return slot()  # type: ignore[no-any-return]
    keys = cache.keys if type(cache) is KVCache else None
    if keys is None or keys.dtype != mx.float32 or cache.offset >= keys.shape[2]:
        return None
    return int(cache.offset)


def _commit(cache: Any, keys: mx.array, values: mx.array) -> None:
    commit = getattr(cache, "commit_decode", None)
    if commit is not None:
        commit(keys, values)
        return
    cache.keys, cache.values = keys, values
    cache.offset += 1


def _appended_attention(
    plan: _Plan, queries: mx.array, keys: mx.array, values: mx.array, cache: Any, mask: Any
) -> mx.array | None:
    """The cache update and attention in one node (`sdpa_decode_append`): the bits of
    update_and_fetch and attention.py's decode call, without the two slice updates and two
    slices a layer that cost a node each. None where that path is not the one the model
    would take: attention not swapped to the extension, a mask it does not take."""
    if _LLAMA.scaled_dot_product_attention is not attention.scaled_dot_product_attention:
        return None
    if isinstance(mask, str):
        if mask != "causal":
            return None
        mask = None  # one query sees every key
    ext = qmm.extension()
    position = _append_slot(cache) if hasattr(ext, "sdpa_decode_append") else None
    if position is None:
        return None
    if mask is not None and not (isinstance(mask, mx.array) and mask.shape[-1] == position + 1):
        return None
    output, new_keys, new_values = ext.sdpa_decode_append(
        queries, keys, values, cache.keys, cache.values, position, plan.scale, mask
    )
    _commit(cache, new_keys, new_values)
    return output  # type: ignore[no-any-return]


def _decode(plan: _Plan, x: mx.array, mask: Any, cache: Any) -> mx.array:
    ext = qmm.extension()
    queries, keys, values = ext.decoder_attention_inputs(
        x, *plan.inputs, norms.offset_array(cache.offset), plan.llama3_freqs
    )
    one_position = x.shape[1] == 1
    output = (
        _appended_attention(plan, queries, keys, values, cache, mask)
        if _append and one_position
        else None
    )
    if output is None:
        keys, values = cache.update_and_fetch(keys, values)
        # The model module's global, as mlx_lm's Attention calls it (attention.py swaps it).
        output = _LLAMA.scaled_dot_product_attention(
            queries, keys, values, cache=cache, scale=plan.scale, mask=mask
        )
    out: mx.array = ext.decoder_mlp_residual(output, x, *plan.outputs)
    return out


class FusedTransformerBlock(llama.TransformerBlock):  # type: ignore[misc]
    # The layer's parts when last looked at, and its plan then (None: not fusable). Set
    # with object.__setattr__: an attribute, not a parameter of the module.
    _decode_plan: tuple[tuple[Any, ...], _Plan | None] | None = None

    def __call__(self, x: mx.array, mask: Any = None, cache: Any = None) -> mx.array:
        # One position a row (decoding), or a short chunk (a prompt's piece beside decoding
        # streams, a draft's check) whose rows stay within the kernel's: past them the
        # projections take dequantize + BLAS, whose bits differ.
        rows = x.shape[0] * x.shape[1] if x.ndim == 3 else 0
        if _enabled and cache is not None and 0 < rows <= qmm.max_rows():
            plan = self.plan()
            if plan is not None and x.dtype == mx.float32:
                return _decode(plan, x, mask, cache)
        return _ORIGINAL_CALL(self, x, mask, cache)  # type: ignore[no-any-return]

    def plan(self) -> _Plan | None:
        """This layer's plan, made again whenever one of its parts changed."""
        parts, known = _parts(self), self._decode_plan
        if known is not None and all(map(is_, parts, known[0])):
            return known[1]
        plan = _plan(self) if _fusable(self) else None
        object.__setattr__(self, "_decode_plan", (parts, plan))
        return plan


def _same_outputs(block: Any) -> bool:
    """The fused layer against mlx_lm's on random inputs, bit for bit: three rows, a
    five-position chunk, then two decode steps."""
    dim = block.input_layernorm["weight"].shape[0]
    prompt = mx.random.normal((3, 5, dim), key=mx.random.key(21)).astype(mx.float32)
    steps = [
        mx.random.normal((3, 1, dim), key=mx.random.key(22 + i)).astype(mx.float32)
        for i in range(2)
    ]

    def pairs() -> Iterator[tuple[mx.array, mx.array]]:
        fused_cache, plain_cache = KVCache(), KVCache()
        plain = _ORIGINAL_CALL(block, prompt, _CAUSAL, plain_cache)
        yield block(prompt, _CAUSAL, fused_cache), plain
        for x in steps:
            yield block(x, None, fused_cache), _ORIGINAL_CALL(block, x, None, plain_cache)

    return same_bits(pairs)


def swap_decoder_layers(model: Any) -> int:
    """Route the decode step of every fusable llama layer through the extension's two layer
    ops; returns how many layers were swapped (0 where the probe found a bit differ)."""
    if not (qmm.status().available and hasattr(qmm.extension(), "decoder_mlp_residual")):
        return 0
    blocks = [m for _, m in model.named_modules() if type(m) is llama.TransformerBlock]
    blocks = [block for block in blocks if _fusable(block)]
    for block in blocks:
        block.__class__ = FusedTransformerBlock
    if blocks and not _same_outputs(blocks[0]):
        for block in blocks:
            block.__class__ = llama.TransformerBlock
        return 0
    return len(blocks)


def uses_fused_layers(model: Any) -> bool:
    return any(type(m) is FusedTransformerBlock for _, m in model.named_modules())
