"""The config watcher against the real filesystem: rename-saves, symlinks, no-op events."""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from vllm_mlx.runtime.reload import watch_config, worth_reloading


class Watch:
    """watch_config running on its own event loop thread, counting reload calls."""

    def __init__(self, path: Path, fail_first: bool = False) -> None:
        self.calls = 0
        self.fail_first = fail_first
        self._loop = asyncio.new_event_loop()
        self._stop = asyncio.Event()
        self._thread = threading.Thread(target=self._run, args=(path,), daemon=True)
        self._ready = threading.Event()
        self._thread.start()

    def _on_change(self) -> None:
        self.calls += 1
        if self.fail_first and self.calls == 1:
            raise RuntimeError("a listener failed")

    def _run(self, path: Path) -> None:
        asyncio.set_event_loop(self._loop)

        async def main() -> None:
            self._loop.call_later(0.3, self._ready.set)  # inotify watches are in place
            await watch_config(path, self._on_change, self._stop)

        self._loop.run_until_complete(main())

    def wait_ready(self) -> None:
        assert self._ready.wait(10), "watcher did not start"

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


def wait_for(condition: Callable[[], bool], what: str, deadline_s: float = 15.0) -> None:
    deadline = time.monotonic() + deadline_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "vllm-mlx.yaml"
    path.write_text("defaults: {max_tokens: 1}\n")
    return path


@pytest.fixture
def watching(config: Path) -> Iterator[Callable[..., Watch]]:
    started: list[Watch] = []

    def start(path: Path, fail_first: bool = False) -> Watch:
        watch = Watch(path, fail_first)
        started.append(watch)
        watch.wait_ready()
        return watch

    yield start
    for watch in started:
        watch.close()


def test_in_place_write_is_seen(config: Path, watching: Callable[..., Watch]) -> None:
    watch = watching(config)
    config.write_text("defaults: {max_tokens: 2}\n")
    wait_for(lambda: watch.calls == 1, "one reload")


def test_rename_save_is_seen_every_time(config: Path, watching: Callable[..., Watch]) -> None:
    watch = watching(config)
    for n in (2, 3):
        temp = config.with_name(".vllm-mlx.yaml.swp")
        temp.write_text(f"defaults: {{max_tokens: {n}}}\n")
        os.replace(temp, config)  # the old inode is gone: a file watch would go blind
        wait_for(lambda n=n: watch.calls == n - 1, f"reload {n - 1}")


def test_same_bytes_and_other_files_do_not_reload(
    config: Path, watching: Callable[..., Watch]
) -> None:
    watch = watching(config)
    config.write_text(config.read_text())  # touched, unchanged
    (config.parent / "notes.txt").write_text("unrelated")
    config.write_text("defaults: {max_tokens: 9}\n")  # a real change, as a marker
    wait_for(lambda: watch.calls >= 1, "the real change")
    assert watch.calls == 1


def test_repointed_symlink_is_seen(tmp_path: Path, watching: Callable[..., Watch]) -> None:
    # Kubernetes ConfigMap layout: file -> ..data/file, ..data -> a versioned directory.
    tmp_path = tmp_path / "configmap"
    tmp_path.mkdir()
    for version in ("v1", "v2"):
        (tmp_path / version).mkdir()
        (tmp_path / version / "vllm-mlx.yaml").write_text(f"# {version}\n")
    (tmp_path / "..data").symlink_to("v1")
    link = tmp_path / "vllm-mlx.yaml"
    link.symlink_to(Path("..data") / "vllm-mlx.yaml")
    watch = watching(link)
    (tmp_path / "..data_tmp").symlink_to("v2")
    os.replace(tmp_path / "..data_tmp", tmp_path / "..data")
    wait_for(lambda: watch.calls == 1, "reload after the link swap")
    (tmp_path / "v2" / "vllm-mlx.yaml").write_text("# v2 edited\n")
    wait_for(lambda: watch.calls == 2, "reload after editing the new target")


def test_symlink_to_another_directory(tmp_path: Path, watching: Callable[..., Watch]) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    target = elsewhere / "real.yaml"
    target.write_text("a: 1\n")
    link_dir = tmp_path / "etc"
    link_dir.mkdir()
    link = link_dir / "vllm-mlx.yaml"
    link.symlink_to(target)
    watch = watching(link)
    target.write_text("a: 2\n")  # the edit happens only in the target's directory
    wait_for(lambda: watch.calls == 1, "reload after editing the link target")


def test_what_is_worth_a_reload() -> None:
    assert worth_reloading(b"a: 2\n", b"a: 1\n")
    assert not worth_reloading(b"a: 1\n", b"a: 1\n")
    assert worth_reloading(None, b"a: 1\n")  # deleted: the reload reports it
    assert not worth_reloading(b"", b"a: 1\n")  # truncated, not yet written
    assert not worth_reloading(b"  \n", b"a: 1\n")


def test_a_failing_reload_does_not_stop_the_watcher(
    config: Path, watching: Callable[..., Watch]
) -> None:
    watch = watching(config, fail_first=True)
    config.write_text("defaults: {max_tokens: 2}\n")
    wait_for(lambda: watch.calls == 1, "the failing reload")
    config.write_text("defaults: {max_tokens: 3}\n")
    wait_for(lambda: watch.calls == 2, "the next reload")


def test_directory_removed_and_recreated(tmp_path: Path, watching: Callable[..., Watch]) -> None:
    directory = tmp_path / "etc"
    directory.mkdir()
    path = directory / "vllm-mlx.yaml"
    path.write_text("a: 1\n")
    watch = watching(path)
    shutil.rmtree(directory)
    wait_for(lambda: watch.calls == 1, "the removal to be reported")
    directory.mkdir()
    path.write_text("a: 2\n")
    wait_for(lambda: watch.calls == 2, "the recreated file")
    path.write_text("a: 3\n")
    wait_for(lambda: watch.calls == 3, "an edit of the recreated file")
