"""The `speculative` section's draft model: which model it names, errors at file:line
for a missing, unknown or unfit one, and check-config refusing a draft whose tokenizer
is not its target's (the load itself is tests/engine/test_speculative_draft.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.support.tiny_model import bundled_tokenizer_dir
from vllm_mlx.cli.main import main
from vllm_mlx.config.errors import ConfigError
from vllm_mlx.config.file import load_settings
from vllm_mlx.config.model import ModelSettings
from vllm_mlx.config.speculative import SpeculativeSettings
from vllm_mlx.engine.scheduler_state import SchedulerConfig, with_speculative
from vllm_mlx.models.draft import draft_settings

BUILTIN = "builtin:smollm2-135m-instruct"
TARGET = f"models:\n  - name: smol\n    source: {BUILTIN}\n"
OTHERS = (
    f"  - name: small\n    source: {BUILTIN}\n    aliases: [tiny]\n    dtype: float32\n"
    f"  - name: vectors\n    source: builtin:all-minilm-l6-v2\n    task: embed\n"
)


def issues_of(path: Path) -> list[tuple[int | None, str, str]]:
    with pytest.raises(ConfigError) as caught:
        load_settings(path)
    return [(i.line, i.key_path, i.message) for i in caught.value.issues]


@pytest.mark.parametrize(
    ("section", "line", "key", "words"),
    [
        # A missing key is located at its section's line.
        ("      method: draft\n", 4, "models[0].speculative.draft_model", "needs draft_model"),
        ("      method: ngram\n      draft_model: small\n", 6,
         "models[0].speculative.draft_model", "method draft only"),
        ("      method: draft\n      draft_model: nowhere\n", 6,
         "models[0].speculative.draft_model", "neither a model in `models` (smol, small, "
         "vectors) nor a source"),
        ("      method: draft\n      draft_model: vectors\n", 6,
         "models[0].speculative.draft_model", "`task: embed` model"),
        ("      method: draft\n      draft_model: /no/such/dir\n", 6,
         "models[0].speculative.draft_model", "nor a source"),
    ],
)  # fmt: skip
def test_a_bad_draft_is_named_at_its_line(
    tmp_path: Path, section: str, line: int, key: str, words: str
) -> None:
    path = tmp_path / "vllm-mlx.yaml"
    path.write_text(TARGET + "    speculative:\n" + section + OTHERS)
    ((at, key_path, message),) = issues_of(path)
    assert (at, key_path) == (line, key)
    assert words in message


def test_a_named_draft_takes_that_models_settings_and_a_source_its_own(tmp_path: Path) -> None:
    path = tmp_path / "vllm-mlx.yaml"
    path.write_text(
        TARGET + "    speculative: {method: draft, draft_model: tiny, num_tokens: 6}\n" + OTHERS
    )
    models = load_settings(path).models
    draft = draft_settings(models, models[0])
    assert draft is not None and (draft.name, draft.dtype) == ("small", "float32")
    assert draft.speculative.method is None  # a draft does not speculate itself
    chosen = with_speculative(SchedulerConfig(), models[0].speculative).speculative
    assert chosen is not None and (chosen.method, chosen.num_tokens) == ("draft", 6)
    section = SpeculativeSettings(method="draft", draft_model=BUILTIN)
    model = ModelSettings(name="m", source=BUILTIN, speculative=section)
    draft = draft_settings([model], model)
    assert draft is not None and draft.source == BUILTIN
    assert draft_settings([models[1]], models[1]) is None


def test_check_config_refuses_a_draft_with_another_tokenizer(
    tmp_path: Path, model_cache_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model_dir = bundled_tokenizer_dir(model_cache_dir)
    other = tmp_path / "other-draft"
    other.mkdir()
    for source in model_dir.iterdir():  # the weights linked, the tokenizer changed
        (other / source.name).symlink_to(source)
    (other / "tokenizer_config.json").unlink()
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    config["eos_token"] = "<|im_start|>"
    (other / "tokenizer_config.json").write_text(json.dumps(config))
    path = tmp_path / "vllm-mlx.yaml"
    good = f"  - name: same\n    source: {model_dir}\n"
    path.write_text(
        TARGET
        + "    speculative: {method: draft, draft_model: same}\n"
        + f"  - name: s2\n    source: {BUILTIN}\n"
        + f"    speculative: {{method: draft, draft_model: {other}}}\n"
        + good
        + f"paths: {{cache_dir: {model_cache_dir}}}\n"
    )
    assert main(["check-config", str(path)]) == 1
    err = capsys.readouterr().err
    assert f"{path}:7:34: models[1].speculative.draft_model: draft_model " in err
    assert "cannot draft for model 's2'" in err and "eos_token_id" in err
    assert "models[0]" not in err  # the same files draft for the bundled model
    shutil.rmtree(other)


def test_vllms_names_are_read_as_ours(tmp_path: Path) -> None:
    path = tmp_path / "vllm-mlx.yaml"
    path.write_text(
        TARGET
        + "    speculative: {method: draft_model, model: small, num_speculative_tokens: 5}\n"
        + f"  - name: lookup\n    source: {BUILTIN}\n"
        + "    speculative: {method: ngram, prompt_lookup_min: 3, prompt_lookup_max: 6}\n"
        + OTHERS
    )
    models = load_settings(path).models
    drafted, looked_up = models[0].speculative, models[1].speculative
    assert (drafted.method, drafted.draft_model, drafted.num_tokens) == ("draft", "small", 5)
    assert (looked_up.method, looked_up.ngram_min, looked_up.ngram_max) == ("ngram", 3, 6)
    path.write_text(TARGET + "    speculative: {num_tokens: 4, num_speculative_tokens: 5}\n")
    ((line, key, message),) = issues_of(path)
    assert key == "models[0].speculative.num_speculative_tokens" and line == 4
    assert "vLLM's name for num_tokens" in message
