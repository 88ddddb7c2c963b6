"""Screenshots of the status page for the README and docs/operations.md.

    .venv/bin/python -m bench.dashboard_screenshots      # writes docs/img/dashboard-*.png

Starts a daemon with the bundled model and an on-demand copy of it, sends a few chat
requests so the charts have something to show, keeps one long request running so the
live table has a row, and photographs /ui at laptop and phone width in Debian's
Chromium (the one the browser tests use).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import yaml
from playwright.sync_api import sync_playwright
from tests.conftest import free_port
from tests.e2e.ops_support import NO_EOS
from tests.support.browser import QUIET_FLAGS, chromium_path

REPO = Path(__file__).resolve().parent.parent
MODEL = "smollm2-135m-instruct"
SIZES = {"laptop": (1280, 900), "phone": (390, 844)}


def _config(port: int) -> dict[str, object]:
    return {
        "server": {"host": "127.0.0.1", "port": port},
        "models": [
            {"name": MODEL, "source": f"builtin:{MODEL}", "aliases": ["default"]},
            {"name": "spare", "source": f"builtin:{MODEL}", "load": "on_demand"},
        ],
        "memory": {"budget_mb": 2048},
    }


def _wait_healthy(url: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)  # polling a readiness condition
    raise RuntimeError("the daemon did not become healthy")


def _traffic(url: str) -> None:
    for prompt in ("Say hello.", "Name three colours.", "What is 2 + 2?"):
        body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "max_tokens": 48}
        httpx.post(f"{url}/v1/chat/completions", json=body, timeout=300).raise_for_status()


def _long_request(url: str, stop: threading.Event) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell a long story."}],
        "max_tokens": 4000,
        "logit_bias": NO_EOS,
        "stream": True,
    }
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=600) as response:
        for _ in response.iter_lines():
            if stop.is_set():
                return


def shoot(out: Path) -> list[Path]:
    browser_path = chromium_path()
    if browser_path is None:
        raise SystemExit("no Chromium: run ./install.sh --dev")
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as work:
        config = Path(work) / "vllm-mlx.yaml"
        config.write_text(yaml.safe_dump(_config(port), sort_keys=False))
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        command = [sys.executable, "-m", "vllm_mlx.cli", "serve", "--config", str(config)]
        log = (Path(work) / "daemon.log").open("wb")
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        stop = threading.Event()
        written = []
        try:
            _wait_healthy(url, process)
            _traffic(url)
            threading.Thread(target=_long_request, args=(url, stop), daemon=True).start()
            sandbox = ["--no-sandbox"] if os.geteuid() == 0 else []
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(
                    executable_path=browser_path, args=[*QUIET_FLAGS, *sandbox]
                )
                for name, (width, height) in SIZES.items():
                    page = browser.new_page(viewport={"width": width, "height": height})
                    page.goto(f"{url}/ui")
                    page.locator("#live tbody tr").first.wait_for(timeout=120_000)
                    path = out / f"dashboard-{name}.png"
                    page.screenshot(path=str(path), full_page=name == "laptop")
                    written.append(path)
                    page.close()
                browser.close()
        finally:
            stop.set()
            process.terminate()
            process.wait(timeout=60)
            log.close()
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "img")
    for path in shoot(parser.parse_args().out):
        print(path)


if __name__ == "__main__":
    main()
