"""Draft-model speculative decoding through the real engine: the bundled model drafting
for itself (acceptance near 100%: the mechanism, not a speed-up) gives token for token
the output without speculation (greedy: 16 prompts alone, 32 16 at a time; seeded
sampled: 4 alone and 4 at a time); a random tiny draft (acceptance near 0) changes nothing either,
and its rows soon stop drafting; a draft with another tokenizer is refused at load."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.support.speculative import PROMPTS, chat, greedy, in_groups
from tests.support.speculative import reference as reference_outputs
from tests.support.tiny_model import bundled_tokenizer_dir, make_tiny_model
from vllm_mlx.config.model import ModelSettings
from vllm_mlx.config.speculative import SpeculativeSettings
from vllm_mlx.engine.engine import Engine
from vllm_mlx.engine.scheduler import SchedulerConfig
from vllm_mlx.engine.speculative.config import SpeculativeConfig
from vllm_mlx.engine.speculative.draft import DraftModel
from vllm_mlx.engine.types import GenerationRequest, SamplingParams
from vllm_mlx.models.draft import draft_settings
from vllm_mlx.models.loaded import LoadedModel
from vllm_mlx.models.loader import load_model

BUILTIN = "builtin:smollm2-135m-instruct"
# Every proposal checked (position and draft cost 0), so every path runs in batches too.
SELF = SpeculativeConfig(num_tokens=4, method="draft", position_cost=0.0, draft_cost=0.0)


def generation(loaded: Any) -> LoadedModel:
    assert isinstance(loaded, LoadedModel)
    return loaded


@pytest.fixture(scope="module")
def own_draft(model_cache_dir: Path) -> LoadedModel:
    """A second copy of the bundled model, as its own draft."""
    return generation(load_model(ModelSettings(name="d", source=BUILTIN), model_cache_dir))


@pytest.fixture(scope="module")
def tiny_draft(tmp_path_factory: pytest.TempPathFactory, model_cache_dir: Path) -> Path:
    """A random 2-layer llama with the bundled model's tokenizer."""
    root = tmp_path_factory.mktemp("draft")
    return make_tiny_model(root / "tiny", bundled_tokenizer_dir(model_cache_dir), "llama", 7)


def started(engine: Engine, draft: LoadedModel, spec: SpeculativeConfig) -> Engine:
    loaded = replace(engine.loaded, draft=draft)
    fresh = Engine(loaded, SchedulerConfig(max_batch_size=16, speculative=spec))
    fresh.start()
    return fresh


@pytest.fixture(scope="module")
def drafting(engine: Engine, own_draft: LoadedModel) -> Iterator[Engine]:
    fresh = started(engine, own_draft, SELF)
    yield fresh
    fresh.stop()


@pytest.fixture(scope="module")
def reference(engine: Engine) -> list[Any]:
    """Every prompt decoded without speculation (tests/support/speculative.py)."""
    return reference_outputs(engine)


# Alone and in a full batch: a batch of 4 added 40-50 s of CI on a 2-core Xeon and no
# path that 16 rows do not take (uneven rewinds, rows moved right). Alone, every other
# prompt (each of the five kinds, three or four times): one at a time is the slow way.
@pytest.mark.parametrize("batch", [1, 16])
def test_greedy_output_is_identical_alone_and_in_a_batch(
    drafting: Engine, reference: list[Any], batch: int
) -> None:
    stats = drafting.scheduler.stats
    drafted, accepted = stats.drafted_tokens, stats.accepted_tokens
    every = 1 if batch > 1 else 2
    got = in_groups(drafting, greedy(drafting, PROMPTS[::every]), batch)
    for text, want, have in zip(PROMPTS[::every], reference[::every], got, strict=True):
        assert have[:2] == want[:2], text
    made, right = stats.drafted_tokens - drafted, stats.accepted_tokens - accepted
    # The model drafting for itself: nearly every proposal is right (a near tie can flip
    # where the draft reads several positions at once and the target one at a time).
    assert made > 10 * len(got) and right > 0.9 * made, (made, right)


def seeded(engine: Engine, count: int) -> list[GenerationRequest]:
    kinds = [
        SamplingParams(temperature=0.8, seed=11),
        SamplingParams(temperature=0.6, top_p=0.9, seed=12),
        SamplingParams(temperature=1.0, top_k=20, seed=13, repetition_penalty=1.2),
        SamplingParams(temperature=0.7, min_p=0.1, seed=14, logit_bias={28: 2.0}),
    ]
    return [
        GenerationRequest(f"s{i}", chat(engine, text), 24, kinds[i % len(kinds)])
        for i, text in enumerate(PROMPTS[:count])
    ]


@pytest.mark.parametrize("batch", [1, 4])
def test_seeded_sampled_rows_give_the_tokens_they_would(
    engine: Engine, drafting: Engine, batch: int
) -> None:
    # Four prompts, one of each kind (eight cost ~13 s more of CI on a 2-core CPU).
    want = in_groups(engine, seeded(engine, 4), batch)
    before = drafting.scheduler.stats.accepted_tokens
    have = in_groups(drafting, seeded(drafting, 4), batch)
    assert [h[:2] for h in have] == [w[:2] for w in want]
    assert drafting.scheduler.stats.accepted_tokens - before > 25  # measured: 39


def test_rows_in_one_batch_use_different_methods(
    drafting: Engine, reference: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Half the rows ask for prompt lookup on the drafting model: each batch of 8 holds
    lookup and draft rows, checked in the same passes; the draft is asked for the draft
    rows only, and every output is the plain one."""
    texts = PROMPTS[:16]
    requests = [
        replace(request, speculative="ngram") if i % 2 else request
        for i, request in enumerate(greedy(drafting, texts))
    ]
    scheduler = drafting.scheduler
    accepted: dict[str, int] = {}
    names: dict[int, str] = {}  # engine row uid -> request id
    asked: set[int] = set()  # uids the draft proposed for
    propose = DraftModel.propose

    def watched(self: DraftModel, sequences: Any, wanted: dict[int, int]) -> Any:
        asked.update(uid for uid, n in wanted.items() if n > 0)
        return propose(self, sequences, wanted)

    def read(_prompt: int, _generated: int) -> None:
        names.update((slot.uid, slot.request.request_id) for slot in scheduler._slots.values())
        for row in scheduler.snapshot():
            if "speculative" in row:
                accepted[row["request_id"]] = row["speculative"]["accepted_tokens"]

    monkeypatch.setattr(DraftModel, "propose", watched)
    scheduler.on_step = read
    try:
        got = in_groups(drafting, requests, 8)
    finally:
        scheduler.on_step = None
    assert [g[:2] for g in got] == [w[:2] for w in reference[:16]]
    lookup = {r.request_id for r in requests if r.speculative == "ngram"}
    assert {names[uid] for uid in asked} == {r.request_id for r in requests} - lookup
    # Both kinds had proposals accepted (lookup fewer: 20-token replies repeat little).
    assert sum(accepted.get(r, 0) for r in lookup) >= 5
    assert sum(n for r, n in accepted.items() if r not in lookup) > 50


def test_a_failing_draft_costs_its_proposals_not_the_batch(
    drafting: Engine, reference: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = {"n": 0}
    propose = DraftModel.propose

    def flaky(self: DraftModel, sequences: Any, wanted: dict[int, int]) -> Any:
        calls["n"] += 1
        if calls["n"] % 3 == 1:  # every third call fails
            raise RuntimeError("draft out of memory")
        return propose(self, sequences, wanted)

    monkeypatch.setattr(DraftModel, "propose", flaky)
    before = drafting.scheduler.stats.accepted_tokens
    got = in_groups(drafting, greedy(drafting, PROMPTS[:8]), 4)
    assert [g[:2] for g in got] == [w[:2] for w in reference[:8]]
    assert calls["n"] > 3 and drafting.scheduler.stats.accepted_tokens > before


def test_a_random_draft_changes_nothing_and_soon_stops_drafting(
    engine: Engine, reference: list[Any], tiny_draft: Path, model_cache_dir: Path
) -> None:
    draft = generation(load_model(ModelSettings(name="t", source=str(tiny_draft)), model_cache_dir))
    # Drafting costs nothing to the plan, so only each row's own record stops it.
    fresh = started(engine, draft, replace(SELF, position_cost=SpeculativeConfig().position_cost))
    try:
        texts = PROMPTS[:8]  # two batches of 4; 12 prompts cost ~6 s more of CI
        got = in_groups(fresh, greedy(fresh, texts, 40), 4)
        want = in_groups(engine, greedy(engine, texts, 40), 4)
        assert [g[:2] for g in got] == [w[:2] for w in want]
        stats = fresh.scheduler.stats
        generated = sum(len(g[0]) for g in got)
        assert stats.drafted_tokens > 0 and stats.accepted_tokens < 0.2 * stats.drafted_tokens
        # Rows that keep failing propose fewer tokens, then pause: far fewer proposed
        # tokens than tokens generated, and few verify passes.
        assert stats.drafted_tokens < 0.5 * generated, (stats.drafted_tokens, generated)
    finally:
        fresh.stop()


def test_a_models_section_loads_its_draft_and_speculates(
    engine: Engine, reference: list[Any], model_cache_dir: Path
) -> None:
    section = SpeculativeSettings(method="draft", draft_model="smol-draft")
    models = [
        ModelSettings(name="smol", source=BUILTIN, speculative=section),
        ModelSettings(name="smol-draft", source=BUILTIN),
    ]
    draft = draft_settings(models, models[0])
    assert draft is not None and draft.source == BUILTIN
    loaded = generation(load_model(models[0], model_cache_dir, draft=draft))
    assert loaded.draft is not None and loaded.draft.model is not loaded.model


def test_a_draft_with_another_tokenizer_is_refused(tmp_path: Path, model_cache_dir: Path) -> None:
    other = shutil.copytree(bundled_tokenizer_dir(model_cache_dir), tmp_path / "other")
    tokenizer = json.loads((other / "tokenizer.json").read_text())
    extra = {"id": 49152, "content": "<|extra|>", "special": True, "normalized": False}
    tokenizer["added_tokens"].append(extra | {"single_word": False, "lstrip": False,
                                               "rstrip": False})  # fmt: skip
    (other / "tokenizer.json").write_text(json.dumps(tokenizer))
    section = SpeculativeSettings(method="draft", draft_model=str(other))
    model = ModelSettings(name="smol", source=BUILTIN, speculative=section)
    draft = draft_settings([model], model)
    assert draft is not None
    with pytest.raises(ValueError, match="cannot draft for model 'smol'") as caught:
        load_model(model, model_cache_dir, draft=draft)
    assert "vocabularies differ" in str(caught.value) and str(other) in str(caught.value)
