"""One engine's adapters (engine/adapters.py) on a tiny llama: loaded on first use,
evicted least recently used under the budget but never while held, a changed adapter
is a new tag and the old one goes once idle."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest

from tests.unit.test_lora import base_model, write_adapter
from vllm_mlx.config.adapters import AdapterSettings
from vllm_mlx.engine.adapters import AdapterUnavailableError, EngineAdapters
from vllm_mlx.models import lora


class InlineScheduler:
    """Runs `call`s at once (the engine thread's part, without a thread)."""

    def call(self, fn: Callable[[], Any]) -> Future[Any]:
        done: Future[Any] = Future()
        try:
            done.set_result(fn())
        except Exception as exc:
            done.set_exception(exc)
        return done


def served(tmp_path: Path, count: int) -> tuple[EngineAdapters, Any, list[AdapterSettings]]:
    model = base_model(False)
    specs = [
        AdapterSettings(name=f"a{i}", path=write_adapter(tmp_path / f"a{i}", seed=i))
        for i in range(count)
    ]
    adapters = EngineAdapters(InlineScheduler(), model)  # type: ignore[arg-type]
    adapters.configure(specs)
    return adapters, model, specs


def test_adapters_load_on_first_use_and_are_evicted_lru_but_never_held(tmp_path: Path) -> None:
    adapters, model, _ = served(tmp_path, 3)

    async def main() -> None:
        first = await adapters.acquire("a0")
        size = adapters.nbytes
        room = int(size * 2.5)  # two adapters fit, not three
        second = await adapters.acquire("a1", lambda _: room)
        adapters.release(first)
        adapters.release(second)
        await adapters.acquire("a0", lambda _: room)  # a0 now used more recently than a1
        third = await adapters.acquire("a2", lambda _: room)
        assert {a.name for a in adapters.loaded()} == {"a0", "a2"}  # a1 was evicted
        assert lora.installed(model) == {a.tag for a in adapters.loaded()}
        assert third.startswith("a2@")
        # Both loaded adapters are held now: nothing can be evicted for a1.
        with pytest.raises(AdapterUnavailableError, match="memory budget"):
            await adapters.acquire("a1", lambda _: room)

    asyncio.run(main())


def test_a_changed_adapter_is_a_new_tag_and_the_old_goes_once_idle(tmp_path: Path) -> None:
    adapters, model, specs = served(tmp_path, 1)

    async def main() -> None:
        old = await adapters.acquire("a0")
        config = json.loads((specs[0].path / "adapter_config.json").read_text())
        config["lora_parameters"]["scale"] = 1.0
        (specs[0].path / "adapter_config.json").write_text(json.dumps(config))
        adapters.configure(specs)  # the hot reload that saw the change
        new = await adapters.acquire("a0")
        assert new != old and lora.installed(model) == {old, new}  # old one still held
        adapters.release(old)
        assert lora.installed(model) == {new}
        adapters.configure([])  # removed: freed once its request ends
        assert lora.installed(model) == {new}
        adapters.release(new)
        assert lora.installed(model) == set() and adapters.nbytes == 0

    asyncio.run(main())


def test_an_adapter_for_another_shape_fails_its_request_only(tmp_path: Path) -> None:
    model = base_model(False)
    weights = write_adapter(tmp_path / "wide", seed=1) / "adapters.safetensors"
    tensors = mx.load(str(weights))
    assert isinstance(tensors, dict)
    # Input dims twice the base's (an adapter for a wider model), rank as configured.
    wide = {k: mx.concatenate([v, v]) if k.endswith("lora_a") else v for k, v in tensors.items()}
    mx.save_safetensors(str(weights), wide)
    adapters = EngineAdapters(InlineScheduler(), model)  # type: ignore[arg-type]
    adapters.configure([AdapterSettings(name="wide", path=tmp_path / "wide")])
    with pytest.raises(AdapterUnavailableError, match="cannot load"):
        asyncio.run(adapters.acquire("wide"))
    assert adapters.loaded() == [] and lora.installed(model) == set()
