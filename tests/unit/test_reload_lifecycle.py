"""What drain and model swaps wait on (the request tracker), and the pid file."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from vllm_mlx.runtime.lifecycle import (
    RequestTracker,
    find_daemon_pid,
    pid_dirs,
    remove_pid_file,
    write_pid_file,
)


class SlowApp:
    """An ASGI app whose requests end when the test says so."""

    def __init__(self) -> None:
        self.release: dict[str, asyncio.Event] = {}

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        await self.release.setdefault(scope["path"], asyncio.Event()).wait()


def http(path: str) -> dict[str, Any]:
    return {"type": "http", "path": path}


async def noop(*_: Any) -> Any:
    return None


def test_tracker_counts_per_listener_and_waits() -> None:
    async def scenario() -> None:
        tracker, app = RequestTracker(), SlowApp()
        a, b = tracker.wrap(app, "a"), tracker.wrap(app, "b")
        first = asyncio.create_task(a(http("/1"), noop, noop))
        second = asyncio.create_task(b(http("/2"), noop, noop))
        await asyncio.sleep(0)
        assert (tracker.in_flight(), tracker.in_flight("a"), tracker.in_flight("b")) == (2, 1, 1)
        assert not await tracker.wait_idle(0.05)  # the limit passes with requests running
        app.release["/1"].set()
        assert await tracker.wait_idle(5, tag="a")
        assert tracker.in_flight() == 1
        app.release["/2"].set()
        assert await tracker.wait_idle(5)
        await asyncio.gather(first, second)

    asyncio.run(scenario())


def test_wait_started_before_ignores_later_requests() -> None:
    async def scenario() -> None:
        tracker, app = RequestTracker(), SlowApp()
        wrapped = tracker.wrap(app, "x")
        old = asyncio.create_task(wrapped(http("/old"), noop, noop))
        await asyncio.sleep(0)
        mark = tracker.mark()
        new = asyncio.create_task(wrapped(http("/new"), noop, noop))
        await asyncio.sleep(0)
        waiter = asyncio.create_task(tracker.wait_started_before(mark))
        await asyncio.sleep(0.01)
        assert not waiter.done()
        app.release["/old"].set()
        async with asyncio.timeout(5):
            assert await waiter
        assert tracker.in_flight() == 1  # the newer request still runs
        app.release["/new"].set()
        await asyncio.gather(old, new)

    asyncio.run(scenario())


def test_tracker_releases_on_error_and_skips_lifespan() -> None:
    async def scenario() -> None:
        tracker = RequestTracker()

        async def broken(scope: Any, receive: Any, send: Any) -> None:
            raise RuntimeError("boom")

        wrapped = tracker.wrap(broken, "x")
        with pytest.raises(RuntimeError):
            await wrapped(http("/"), noop, noop)
        with pytest.raises(RuntimeError):
            await wrapped({"type": "lifespan"}, noop, noop)
        assert tracker.in_flight() == 0 and tracker.mark() == 1

    asyncio.run(scenario())


@pytest.fixture
def run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    # Daemons of other tests on this machine write to the system run dir: keep it apart.
    monkeypatch.setattr("vllm_mlx.runtime.lifecycle.SYSTEM_RUN_DIR", tmp_path / "system-run")
    monkeypatch.delenv("RUNTIME_DIRECTORY", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "xdg"))
    return tmp_path / "xdg" / "vllm-mlx"


def test_pid_dirs_prefer_systemd_then_session(
    tmp_path: Path, run_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert pid_dirs(tmp_path / "cache")[0] == run_dir
    monkeypatch.setenv("RUNTIME_DIRECTORY", str(tmp_path / "systemd"))
    dirs = pid_dirs(tmp_path / "cache")
    assert dirs[:2] == [tmp_path / "systemd", run_dir]
    assert tmp_path / "cache" / "run" in dirs


def test_pid_file_round_trip(tmp_path: Path, run_dir: Path) -> None:
    path = write_pid_file(tmp_path / "cache", 8123)
    assert path == run_dir / "vllm-mlx-8123.pid"
    assert find_daemon_pid(tmp_path / "cache", 8123) == os.getpid()
    remove_pid_file(path)
    assert not path.exists()
    with pytest.raises(LookupError, match="no running daemon for port 8123"):
        find_daemon_pid(tmp_path / "cache", 8123)


def test_only_running_daemon_is_found_from_another_port(tmp_path: Path, run_dir: Path) -> None:
    write_pid_file(tmp_path / "cache", 8123)
    # The file now names port 9000, which only a reload would apply.
    assert find_daemon_pid(tmp_path / "cache", 9000) == os.getpid()


def test_stale_and_foreign_pid_files(tmp_path: Path, run_dir: Path) -> None:
    run_dir.mkdir(parents=True)
    (run_dir / "vllm-mlx-8123.pid").write_text("999999999\n")  # no such process
    with pytest.raises(LookupError):
        find_daemon_pid(tmp_path / "cache", 8123)
    mine = run_dir / "vllm-mlx-8124.pid"
    mine.write_text("1\n")  # someone else's daemon now owns the file
    remove_pid_file(mine)
    assert mine.exists()
