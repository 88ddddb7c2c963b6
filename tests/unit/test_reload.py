"""Diffing settings by x-reload marker and applying them to a daemon's state (no model)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from vllm_mlx.api.state import ServerState
from vllm_mlx.config.errors import ConfigError, ConfigIssue
from vllm_mlx.config.fields import Reload
from vllm_mlx.config.model import ModelSettings
from vllm_mlx.config.settings import Settings
from vllm_mlx.engine.fleet.registry import ModelRegistry
from vllm_mlx.engine.scheduler import SchedulerConfig
from vllm_mlx.runtime.reload import Change, Reloader, merge_hot

BUILTIN = "builtin:smollm2-135m-instruct"


def settings(**sections: Any) -> Settings:
    return Settings(**sections)


def model(name: str, aliases: list[str] | None = None) -> dict[str, Any]:
    return {"name": name, "source": BUILTIN, "aliases": aliases or []}


def test_hot_change_is_applied_and_reported() -> None:
    running = settings(defaults={"max_tokens": 10})
    merged, changes = merge_hot(running, settings(defaults={"max_tokens": 20}))
    assert merged.defaults.max_tokens == 20
    assert changes == [Change("defaults.max_tokens", Reload.HOT)]


def test_model_and_restart_changes_are_pending_not_applied() -> None:
    running = settings(models=[model("a")], server={"port": 8000})
    new = settings(models=[model("b")], server={"port": 9000, "timeout": 5})
    merged, changes = merge_hot(running, new)
    assert merged.models[0].name == "a"
    assert merged.server.port == 8000
    assert merged.server.timeout == 5  # hot key in the same section still applies
    assert set(changes) == {
        Change("models[0].name", Reload.MODEL),
        Change("server.port", Reload.RESTART),
        Change("server.timeout", Reload.HOT),
    }


def test_alias_inside_a_model_entry_is_hot() -> None:
    running = settings(models=[model("a", ["x"])])
    merged, changes = merge_hot(running, settings(models=[model("a", ["y"])]))
    assert merged.models[0].aliases == ["y"]
    assert changes == [Change("models[0].aliases", Reload.HOT)]


def test_added_model_is_a_pending_change_of_the_whole_list() -> None:
    running = settings(models=[model("a")])
    merged, changes = merge_hot(running, settings(models=[model("a"), model("b")]))
    assert [m.name for m in merged.models] == ["a"]
    assert changes == [Change("models", Reload.MODEL)]


def test_unchanged_settings_give_the_same_object() -> None:
    running = settings()
    merged, changes = merge_hot(running, settings())
    assert merged is running and changes == []


def test_field_without_marker_counts_as_restart() -> None:
    class Plain(BaseModel):
        value: int = 1

    _, changes = merge_hot(Plain(), Plain(value=2))
    assert changes == [Change("value", Reload.RESTART)]


class Harness:
    """A Reloader over a real ServerState whose `load` returns what a test sets."""

    def __init__(self, start: Settings) -> None:
        self.next: Settings | Exception = start
        self.results: list[bool] = []
        self.full_calls: list[list[Change]] = []
        self.full_error: Exception | None = None
        registry = ModelRegistry(start.models, SchedulerConfig())
        self.state = ServerState(start, registry)
        self.reloader = Reloader(self.state, self.load, self.apply_full, self.results.append)

    def load(self) -> Settings:
        if isinstance(self.next, Exception):
            raise self.next
        return self.next

    async def apply_full(self, new: Settings, changes: list[Change]) -> None:
        self.full_calls.append(changes)
        if self.full_error is not None:
            raise self.full_error


def test_reload_file_swaps_settings_and_lists_pending() -> None:
    h = Harness(settings(models=[model("a", ["x"])]))
    h.next = settings(models=[model("b", ["y"])], defaults={"temperature": 0.1})
    before = h.state.settings
    changes = h.reloader.reload_file()
    assert changes is not None
    assert h.state.settings is not before  # a new object: in-flight requests keep theirs
    assert h.state.settings.defaults.temperature == 0.1
    assert h.state.settings.models[0].name == "a"
    assert h.state.pending_changes == ["models[0].name (model)"]
    assert h.state.registry.resolve("y") is not None  # aliases re-applied
    assert h.state.registry.resolve("x") is None
    assert h.results == [True] and h.full_calls == []


def test_reverting_a_pending_change_clears_it() -> None:
    start = settings(server={"port": 8000})
    h = Harness(start)
    h.next = settings(server={"port": 9000})
    h.reloader.reload_file()
    assert h.state.pending_changes == ["server.port (restart)"]
    h.next = start
    h.reloader.reload_file()
    assert h.state.pending_changes == []


def test_invalid_file_keeps_last_good_config() -> None:
    h = Harness(settings(defaults={"max_tokens": 7}))
    good = h.state.settings
    issue = ConfigIssue("server.prot", "unknown key", "/etc/vllm-mlx.yaml", 3, 3)
    h.next = ConfigError([issue])
    assert h.reloader.reload_file() is None
    assert h.state.settings is good
    assert h.state.config_error == "/etc/vllm-mlx.yaml:3:3: server.prot: unknown key"
    assert h.results == [False]
    h.next = settings(defaults={"max_tokens": 8})
    h.reloader.reload_file()
    assert h.state.config_error is None and h.state.settings.defaults.max_tokens == 8


def test_unexpected_load_failure_is_rejected_not_raised() -> None:
    h = Harness(settings())
    h.next = OSError("disk gone")
    assert h.reloader.reload_file() is None
    assert h.state.config_error is not None and "disk gone" in h.state.config_error


def test_full_reload_applies_everything_through_the_daemon() -> None:
    h = Harness(settings(models=[model("a")], server={"port": 8000}))
    h.next = settings(models=[model("b")], server={"port": 9000}, defaults={"top_k": 3})
    h.reloader.reload_file()
    changes = asyncio.run(h.reloader.reload_all())
    assert changes is not None
    assert [c.key for c in h.full_calls[0]] == ["server.port", "models[0].name"]
    assert h.state.settings.models[0].name == "b" and h.state.settings.server.port == 9000
    assert h.state.pending_changes == []


def test_failed_full_reload_changes_nothing() -> None:
    h = Harness(settings(models=[model("a")]))
    h.next = settings(models=[model("b")])
    h.full_error = RuntimeError("out of memory")
    before = h.state.settings
    assert asyncio.run(h.reloader.reload_all()) is None
    assert h.state.settings is before
    assert h.state.config_error == "reload failed: out of memory"
    assert h.results == [False]


def test_hot_only_full_reload_does_not_touch_models() -> None:
    h = Harness(settings())
    h.next = settings(defaults={"top_p": 0.5})
    asyncio.run(h.reloader.reload_all())
    assert h.full_calls == [] and h.state.settings.defaults.top_p == 0.5


def test_listeners_see_previous_and_current() -> None:
    h = Harness(settings())
    seen: list[tuple[float, float]] = []
    h.reloader.add_listener(lambda old, new: seen.append((old.server.timeout, new.server.timeout)))
    h.next = settings(server={"timeout": 9})
    h.reloader.reload_file()
    assert seen == [(600.0, 9.0)]


def test_logging_is_reconfigured_on_change(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(
        "vllm_mlx.runtime.reload.configure_logging", lambda s: calls.append(s.level)
    )
    h = Harness(settings())
    h.next = settings(defaults={"top_k": 2})
    h.reloader.reload_file()
    h.next = settings(defaults={"top_k": 2}, logging={"level": "debug"})
    h.reloader.reload_file()
    assert calls == ["debug"]


def test_model_settings_copy_keeps_validation_rules() -> None:
    # merge_hot builds objects with model_copy (no validation): they must still compare
    # equal to a validated object with the same values.
    merged, _ = merge_hot(settings(models=[model("a")]), settings(models=[model("a", ["z"])]))
    assert merged.models[0] == ModelSettings(name="a", source=BUILTIN, aliases=["z"])


def write_then_rename(path: Path, text: str) -> None:
    """How vim, VS Code and most editors save: a new file renamed over the old one."""
    temp = path.with_name(f".{path.name}.tmp")
    temp.write_text(text)
    temp.replace(path)


def wait_for(condition: Callable[[], bool], what: str, deadline_s: float = 10.0) -> None:
    import time

    deadline = time.monotonic() + deadline_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def test_watched_dirs_follow_symlink_chain(tmp_path: Path) -> None:
    from vllm_mlx.runtime.reload import watched_dirs

    real = tmp_path / "data-v1"
    real.mkdir()
    (real / "vllm-mlx.yaml").write_text("{}")
    (tmp_path / "..data").symlink_to("data-v1")
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "vllm-mlx.yaml").symlink_to(tmp_path / "..data" / "vllm-mlx.yaml")
    assert watched_dirs(conf / "vllm-mlx.yaml") == {conf, tmp_path, real}


class FakeAdapters:
    """What a kept engine is told about its LoRA adapters on each swap."""

    def __init__(self) -> None:
        self.configured: list[list[str]] = []

    def configure(self, adapters: list[Any]) -> None:
        self.configured.append([a.name for a in adapters])


class FakeEngine:
    stopped = False

    def __init__(self) -> None:
        self.adapters = FakeAdapters()

    def stop(self) -> None:
        self.stopped = True


def registry_serving(*models: ModelSettings) -> tuple[ModelRegistry, dict[str, FakeEngine]]:
    from vllm_mlx.engine.fleet.registry import LoadState

    registry = ModelRegistry(models, SchedulerConfig())
    engines = {}
    for entry in registry.entries():
        engines[entry.settings.name] = FakeEngine()
        entry.engine, entry.state = engines[entry.settings.name], LoadState.RUNNING  # type: ignore[assignment]
    return registry, engines


def no_loading(model: ModelSettings) -> Any:
    raise AssertionError(f"{model.name} should not have been loaded")


def test_prepare_keeps_engines_whose_model_keys_are_unchanged() -> None:
    a = ModelSettings(name="a", source=BUILTIN, aliases=["x"])
    registry, engines = registry_serving(a)
    changed_hot = a.model_copy(update={"aliases": ["y"], "reasoning_parser": "qwen3"})
    entries = registry.prepare([changed_hot], SchedulerConfig(), no_loading)
    assert entries["a"].engine is engines["a"] and entries["a"].settings is changed_hot  # type: ignore[comparison-overlap]
    assert registry.swap(entries, [changed_hot], SchedulerConfig()) == []
    assert registry.resolve("y") is not None and registry.resolve("x") is None


def test_prepare_loads_a_changed_model_and_failure_changes_nothing() -> None:
    a = ModelSettings(name="a", source=BUILTIN)
    registry, engines = registry_serving(a)
    calls: list[str] = []

    def failing(model: ModelSettings) -> Any:
        calls.append(model.name)
        raise RuntimeError("no memory")

    with pytest.raises(RuntimeError, match="no memory"):
        registry.prepare([a.model_copy(update={"context_length": 64})], SchedulerConfig(), failing)
    assert calls == ["a"]
    assert registry.resolve("a") is not None and registry.resolve("a").engine is engines["a"]  # type: ignore[union-attr]
    with pytest.raises(AssertionError, match="should not have been loaded"):
        registry.prepare([a], SchedulerConfig(), no_loading, reuse=False)


def test_swap_retires_engines_no_longer_served() -> None:
    a, b = ModelSettings(name="a", source=BUILTIN), ModelSettings(name="b", source=BUILTIN)
    registry, engines = registry_serving(a, b)
    kept = registry.prepare([b], SchedulerConfig(), no_loading)
    retired = registry.swap(kept, [b], SchedulerConfig())
    assert retired == [engines["a"]]  # type: ignore[comparison-overlap]
    assert registry.resolve("a") is None and [e.settings.name for e in registry.entries()] == ["b"]


def test_full_reload_leaves_process_restart_keys_pending() -> None:
    # engine.blas is chosen before mlx is imported: no reload can apply it.
    h = Harness(settings(server={"port": 8000}))
    h.next = settings(server={"port": 9000}, engine={"blas": "bundled"})
    asyncio.run(h.reloader.reload_all())
    assert [c.key for c in h.full_calls[0]] == ["server.port"]
    assert h.state.settings.server.port == 9000
    assert h.state.settings.engine.blas == "auto"  # still the running value
    assert h.state.pending_changes == ["engine.blas (restart)"]
