"""LoRA adapters in the engine's continuous batch against mlx-lm's own generation with
that adapter (`mlx_lm.load(path, adapter_path=...)` + `stream_generate`), greedy, token
for token: alone, and base and adapter rows in one batch.

The reference runs on the same compute path as the engine (the CPU kernels the loader
swaps in, applied to mlx-lm's model the same way), so the only difference left is the
one under test: per-row adapters beside the base layers instead of mlx-lm's LoRALinear.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mlx_lm.generate import stream_generate
from mlx_lm.tuner.utils import load_adapters
from mlx_lm.utils import load

from vllm_mlx.config.adapters import AdapterSettings
from vllm_mlx.config.model import ModelSettings
from vllm_mlx.engine.engine import Engine
from vllm_mlx.engine.scheduler import SchedulerConfig
from vllm_mlx.engine.types import (
    GenerationRequest,
    PromptProcessed,
    SequenceFinished,
    TokensGenerated,
)
from vllm_mlx.models.loaded import LoadedModel
from vllm_mlx.models.loader import _apply_dtype, load_model

UPPERCASE = Path(__file__).resolve().parents[1] / "fixtures" / "lora" / "uppercase"
PROMPTS = ["What is the capital of France?", "Name a fruit.", "What do bees make?"]
NEW_TOKENS = 12


@pytest.fixture(scope="module")
def half(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A second adapter: the fixture's tensors at half its scale (another update)."""
    path = tmp_path_factory.mktemp("adapters") / "half"
    shutil.copytree(UPPERCASE, path)
    config = json.loads((path / "adapter_config.json").read_text())
    config["lora_parameters"]["scale"] /= 2
    (path / "adapter_config.json").write_text(json.dumps(config))
    return path


@pytest.fixture(scope="module")
def settings(half: Path) -> ModelSettings:
    adapters = [
        AdapterSettings(name="upper", path=UPPERCASE),
        AdapterSettings(name="half", path=half),
    ]
    return ModelSettings(name="smol", source="builtin:smollm2-135m-instruct", adapters=adapters)


@pytest.fixture(scope="module")
def engine(settings: ModelSettings, model_cache_dir: Path) -> Iterator[Engine]:
    loaded = load_model(settings, model_cache_dir)
    assert isinstance(loaded, LoadedModel)
    config = SchedulerConfig(max_batch_size=8, prefix_cache_bytes=64 * 2**20, paged_cache=True)
    engine = Engine(loaded, config)
    engine.start()
    engine.adapters.configure(settings.adapters)
    yield engine
    engine.stop()


def reference(
    engine: Engine, settings: ModelSettings, adapter: Path | None, prompts: list[list[int]]
) -> list[list[int]]:
    """mlx-lm's greedy tokens for each prompt, with the adapter loaded its own way
    (`load_adapters`, what `mlx_lm.load(..., adapter_path=)` calls), after the loader's
    CPU kernel swaps (they swap by layer class, which mlx-lm's LoRALinear wrapping hides)."""
    model, tokenizer = load(engine.loaded.directory)[:2]
    model, _, _ = _apply_dtype(model, settings)
    if adapter is not None:
        load_adapters(model, str(adapter))
    model.eval()
    eos = set(tokenizer.eos_token_ids)
    out = []
    for prompt in prompts:
        tokens = [r.token for r in stream_generate(model, tokenizer, prompt, max_tokens=NEW_TOKENS)]
        out.append(tokens[:-1] if tokens and tokens[-1] in eos else tokens)  # as the engine
    return out


def chat(engine: Engine, text: str) -> list[int]:
    messages = [{"role": "user", "content": text}]
    return list(engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True))


async def tokens_of(engine: Engine, request: GenerationRequest) -> tuple[list[int], int]:
    """The request's tokens (end of sequence dropped, as mlx-lm's stream does) and the
    prompt tokens its prefix-cache lookup reused."""
    out: list[int] = []
    cached = -1
    async for event in engine.events(request):
        if isinstance(event, PromptProcessed):
            cached = event.cached_tokens
        elif isinstance(event, TokensGenerated):
            out.extend(event.tokens)
        elif isinstance(event, SequenceFinished):
            assert event.message == "", event.message
    return out, cached


def run(engine: Engine, jobs: list[tuple[str | None, list[int]]]) -> list[tuple[list[int], int]]:
    """Each (adapter name or None, prompt) as one request, all submitted together."""

    async def main() -> list[tuple[list[int], int]]:
        tags = [await engine.adapters.acquire(name) if name else None for name, _ in jobs]
        requests = [
            GenerationRequest(f"r{i}", prompt, NEW_TOKENS, adapter=tag)
            for i, (tag, (_, prompt)) in enumerate(zip(tags, jobs, strict=True))
        ]
        try:
            return list(await asyncio.gather(*(tokens_of(engine, r) for r in requests)))
        finally:
            for tag in tags:
                if tag is not None:
                    engine.adapters.release(tag)

    return asyncio.run(main())


@pytest.fixture(scope="module")
def expected(engine: Engine, settings: ModelSettings, half: Path) -> dict[Any, list[list[int]]]:
    prompts = [chat(engine, text) for text in PROMPTS]
    return {
        name: reference(engine, settings, path, prompts)
        for name, path in ((None, None), ("upper", UPPERCASE), ("half", half))
    }


def test_an_adapter_alone_matches_mlx_lm_and_changes_the_answer(
    engine: Engine, expected: dict[Any, list[list[int]]]
) -> None:
    prompt = chat(engine, PROMPTS[0])
    ((got, _),) = run(engine, [("upper", prompt)])
    assert got == expected["upper"][0]
    text = engine.tokenizer.decode(got)
    assert text.strip() and text == text.upper(), text  # the adapter's visible effect
    assert expected[None][0] != got


def test_base_and_two_adapters_in_one_batch_match_mlx_lm(
    engine: Engine, expected: dict[Any, list[list[int]]]
) -> None:
    names: list[str | None] = [None, "upper", "half"]
    jobs = [(name, chat(engine, text)) for text in PROMPTS for name in names]
    results = run(engine, jobs)
    for n, ((name, _), (got, _)) in enumerate(zip(jobs, results, strict=True)):
        assert got == expected[name][n // len(names)], (name, n)
    assert len(engine.adapters.loaded()) == 2


def test_a_prefix_cached_under_one_adapter_is_not_reused_for_another(engine: Engine) -> None:
    # A system prompt of its own: no other test cached any of it (under any adapter).
    messages = [
        {"role": "system", "content": "You answer questions about colours."},
        {"role": "user", "content": "Tell me a color, please."},
    ]
    prompt = list(engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True))
    ((base, _),) = run(engine, [(None, prompt)])  # stores the prompt under the base
    ((_, whole),) = run(engine, [(None, prompt)])  # what reusing that entry looks like
    ((upper, cached_upper),) = run(engine, [("upper", prompt)])
    ((_, cached_half),) = run(engine, [("half", prompt)])
    ((again, cached_again),) = run(engine, [("upper", prompt)])
    assert whole >= len(prompt) - 16  # all but the last (partial) block's tail
    # Neither adapter reuses the base's entry, nor one another's (at most a few leading
    # tokens their own earlier prompts shared: the chat template's opening).
    assert cached_upper < whole and cached_half < whole
    assert cached_again == whole  # the adapter's own entry is reused like the base's
    assert again == upper != base


def test_an_adapter_not_loaded_is_refused_alone(engine: Engine) -> None:
    prompt = chat(engine, PROMPTS[2])

    async def main() -> SequenceFinished:
        request = GenerationRequest("x", prompt, 4, adapter="nothing@0")
        async for event in engine.events(request):
            if isinstance(event, SequenceFinished):
                return event
        raise AssertionError("no finish")

    finished = asyncio.run(main())
    assert finished.refused and "not loaded" in finished.message
