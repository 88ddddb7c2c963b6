"""A real headless Chromium (Debian's package) driven by Playwright for Python.

Playwright's own browser download cannot run here, so it drives the system Chromium
that `install.sh --dev` installs. The flags keep Chromium from dialling Google's
services, which this machine's closed network refuses (and which slow each start).
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from playwright.sync_api import Browser, sync_playwright

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
QUIET_FLAGS = [
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]
MAC_CHROME = "/Applications/Google Chrome.app/Contents/MacOS/Google Chrome"


def chromium_path() -> str | None:
    found = os.environ.get("VLLM_MLX_TEST_CHROMIUM")
    for name in CHROMIUM_NAMES:
        found = found or shutil.which(name)
    if found is None and sys.platform == "darwin" and os.path.exists(MAC_CHROME):
        found = MAC_CHROME
    return found


@contextmanager
def chromium() -> Iterator[Browser]:
    path = chromium_path()
    if path is None:
        if sys.platform == "linux":  # install.sh --dev installs it: its absence is a failure
            pytest.fail("no Chromium: run ./install.sh --dev (Debian's chromium package)")
        pytest.skip("no Chromium or Chrome found (set VLLM_MLX_TEST_CHROMIUM)")
    # As root (CI containers) Chromium refuses to start without --no-sandbox.
    sandbox = ["--no-sandbox"] if os.geteuid() == 0 else []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=path, headless=True, args=[*QUIET_FLAGS, *sandbox]
        )
        try:
            yield browser
        finally:
            browser.close()
