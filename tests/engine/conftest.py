"""The engine on the real bundled model, one per test module."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from vllm_mlx.config.model import ModelSettings
from vllm_mlx.engine.engine import Engine
from vllm_mlx.engine.scheduler import SchedulerConfig
from vllm_mlx.models.loader import load_model


@pytest.fixture(scope="module")
def engine(model_cache_dir: Path) -> Iterator[Engine]:
    settings = ModelSettings(name="smol", source="builtin:smollm2-135m-instruct")
    engine = Engine(load_model(settings, model_cache_dir), SchedulerConfig(max_batch_size=8))
    engine.start()
    yield engine
    engine.stop()
