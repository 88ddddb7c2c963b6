"""A model with a draft: the draft's weights and its KV cache count in the model's
footprint (the memory budget and /v1/status read it)."""

from __future__ import annotations

from dataclasses import replace

from tests.support.tiny_model import tiny_llama
from vllm_mlx.config.model import ModelSettings
from vllm_mlx.engine.fleet.registry import ModelEntry, measure
from vllm_mlx.engine.fleet.sizes import kv_bytes_per_token, module_bytes
from vllm_mlx.models.loaded import LoadedModel


def test_the_drafts_weights_and_kv_are_counted() -> None:
    target, draft = tiny_llama(), tiny_llama()
    loaded = LoadedModel("m", target, None, 2048, "/nowhere", kv_itemsize=4)
    entry = ModelEntry(ModelSettings(name="m", source="builtin:smollm2-135m-instruct"))
    measure(entry, loaded)
    alone = (entry.weights_bytes, entry.kv_token_bytes)
    assert alone == (module_bytes(target), kv_bytes_per_token(target, itemsize=4))
    measure(entry, replace(loaded, draft=LoadedModel("d", draft, None, 2048, "/nowhere")))
    assert entry.weights_bytes == alone[0] + module_bytes(draft)
    assert entry.kv_token_bytes == alone[1] + kv_bytes_per_token(draft) > alone[1]
