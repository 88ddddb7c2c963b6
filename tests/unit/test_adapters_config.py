"""`models[].adapters` in the config file: bad adapters are errors at their line, the ids
they add resolve to their base, and a change reaches the running engine without a
reload of the base."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.unit.test_lora import write_adapter
from tests.unit.test_reload import BUILTIN, no_loading, registry_serving
from vllm_mlx.config.adapters import AdapterSettings
from vllm_mlx.config.errors import ConfigError
from vllm_mlx.config.file import load_config
from vllm_mlx.config.model import ModelSettings
from vllm_mlx.engine.scheduler import SchedulerConfig


def config_file(tmp_path: Path, adapters: list[dict[str, str]], **model: object) -> Path:
    entry = {"name": "smol", "source": BUILTIN, "adapters": adapters, **model}
    path = tmp_path / "vllm-mlx.yaml"
    path.write_text(yaml.safe_dump({"models": [entry]}, sort_keys=False))
    return path


def problems(path: Path) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load_config(str(path))
    return [str(issue) for issue in caught.value.issues]


def line_of(path: Path, text: str) -> int:
    return next(n for n, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def test_a_good_adapter_loads_and_a_missing_one_is_an_error_at_its_path(tmp_path: Path) -> None:
    good = write_adapter(tmp_path / "good", seed=1)
    loaded = load_config(str(config_file(tmp_path, [{"name": "upper", "path": str(good)}])))
    assert [a.name for a in loaded.settings.models[0].adapters] == ["upper"]
    path = config_file(tmp_path, [{"name": "upper", "path": str(tmp_path / "nope")}])
    (issue,) = problems(path)
    assert f":{line_of(path, 'nope')}:" in issue
    assert "models[0].adapters[0].path" in issue and "does not exist" in issue


def test_a_wrong_rank_and_a_dora_adapter_are_errors(tmp_path: Path) -> None:
    rank = write_adapter(tmp_path / "rank", seed=1)
    config = json.loads((rank / "adapter_config.json").read_text())
    config["lora_parameters"]["rank"] = 16
    (rank / "adapter_config.json").write_text(json.dumps(config))
    (issue,) = problems(config_file(tmp_path, [{"name": "r", "path": str(rank)}]))
    assert "not rank 16" in issue
    config.update(fine_tune_type="dora", lora_parameters={**config["lora_parameters"], "rank": 4})
    (rank / "adapter_config.json").write_text(json.dumps(config))
    (issue,) = problems(config_file(tmp_path, [{"name": "r", "path": str(rank)}]))
    assert "dora" in issue


def test_adapter_ids_must_be_unique_and_plain(tmp_path: Path) -> None:
    good = str(write_adapter(tmp_path / "good", seed=1))
    path = config_file(tmp_path, [{"name": "smol", "path": good}])
    (issue,) = problems(path)
    assert "models[0].adapters[0].name" in issue and "already used" in issue
    (issue,) = problems(config_file(tmp_path, [{"name": "a:b", "path": good}]))
    assert "no `:`" in issue
    (issue,) = problems(config_file(tmp_path, [{"name": "u", "path": good}], task="embed"))
    assert "generation models" in issue


def test_adapter_ids_resolve_to_the_base_and_a_change_is_hot(tmp_path: Path) -> None:
    good = write_adapter(tmp_path / "good", seed=1)
    base = ModelSettings(name="smol", source=BUILTIN)
    registry, engines = registry_serving(base)
    assert registry.adapter_ids_of("smol") == [] and registry.resolve("upper") is None
    served = ModelSettings(
        name="smol", source=BUILTIN, adapters=[AdapterSettings(name="upper", path=good)]
    )
    entries = registry.prepare([served], SchedulerConfig(), no_loading)  # nothing loads
    assert entries["smol"].engine is engines["smol"]  # type: ignore[comparison-overlap]
    registry.swap(entries, [served], SchedulerConfig())
    assert engines["smol"].adapters.configured == [["upper"]]
    for model_id in ("upper", "smol:upper"):
        assert registry.resolve(model_id) is entries["smol"]
        assert registry.adapter_of(model_id) == "upper"
    assert registry.adapter_of("smol") is None
    assert registry.adapter_ids_of("smol") == ["upper", "smol:upper"]
    entries = registry.prepare([base], SchedulerConfig(), no_loading)
    registry.swap(entries, [base], SchedulerConfig())
    assert engines["smol"].adapters.configured[-1] == [] and registry.resolve("upper") is None


def test_check_config_refuses_an_adapter_made_for_another_model(
    tmp_path: Path, model_cache_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from vllm_mlx.cli.main import main

    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "lora" / "uppercase"
    other = write_adapter(tmp_path / "tiny-llama", seed=1)  # a tiny llama's, not SmolLM2's
    entry = {
        "name": "smol",
        "source": BUILTIN,
        "adapters": [{"name": "upper", "path": str(fixture)}, {"name": "tiny", "path": str(other)}],
    }
    path = tmp_path / "vllm-mlx.yaml"
    path.write_text(
        yaml.safe_dump({"models": [entry], "paths": {"cache_dir": str(model_cache_dir)}})
    )
    assert main(["check-config", str(path)]) == 1
    err = capsys.readouterr().err
    line = line_of(path, "tiny-llama")
    assert f"{path}:{line}:" in err and "models[0].adapters[1].path" in err
    assert "was not made for 'builtin:smollm2-135m-instruct'" in err and "width" in err
    assert "adapters[0]" not in err  # the real SmolLM2 adapter fits
