"""The status page in a real browser (headless Chromium) against a real daemon.

Two models: the bundled one (loaded at startup) and `spare`, a copy that loads on
demand, so the page has both states to show and a model to load and unload. A key is
configured: the page must ask for it before it shows anything.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from playwright.sync_api import Browser, Page, Route, expect

from tests.conftest import DaemonProcess, running
from tests.e2e.ops_support import NO_EOS, wait_for
from tests.support.browser import chromium
from tests.support.mcp_helpers import stdio_server

KEY = "sk-dashboard-test"
MAIN = "smollm2-135m-instruct"
SPARE = "spare"
WAIT_MS = 60_000  # the page polls every 2 s; a model load takes a few seconds


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, model_cache_dir: Path) -> Iterator[Any]:
    config = {
        "models": [
            {"name": MAIN, "source": f"builtin:{MAIN}"},
            {"name": SPARE, "source": f"builtin:{MAIN}", "load": "on_demand", "keep_alive": 600},
        ],
        "auth": {"api_keys": [KEY]},
        "mcp": {"servers": {"demo": stdio_server()}},  # a real MCP server (the mcp SDK)
    }
    with running(tmp_path_factory.mktemp("dashboard"), model_cache_dir, config) as process:
        yield process


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as instance:
        yield instance


def _status(daemon: DaemonProcess) -> dict[str, Any]:
    response = httpx.get(f"{daemon.base_url}/v1/status", headers={"Authorization": f"Bearer {KEY}"})
    response.raise_for_status()
    document: dict[str, Any] = response.json()
    return document


def _model_state(daemon: DaemonProcess, name: str) -> str:
    return next(str(m["state"]) for m in _status(daemon)["models"] if m["model"] == name)


@pytest.fixture
def page(browser: Browser, daemon: DaemonProcess) -> Iterator[Page]:
    """The page, opened at `/` as a person would (the browser is sent to /ui), with the
    key typed in."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    tab = context.new_page()
    problems: list[str] = []
    tab.on("pageerror", lambda error: problems.append(str(error)))
    tab.goto(f"{daemon.base_url}/")
    expect(tab).to_have_url(re.compile(r"/ui$"))
    tab.get_by_test_id("key-input").fill(KEY)
    tab.get_by_test_id("key-submit").click()
    expect(tab.locator(f'[data-model="{MAIN}"]')).to_be_visible(timeout=WAIT_MS)
    yield tab
    context.close()
    assert not problems, f"the page's script failed: {problems}"


def test_the_page_refuses_without_the_key(browser: Browser, daemon: DaemonProcess) -> None:
    context = browser.new_context()
    tab = context.new_page()
    tab.goto(f"{daemon.base_url}/ui")
    expect(tab.get_by_test_id("key-dialog")).to_be_visible(timeout=WAIT_MS)
    expect(tab.get_by_test_id("overall")).to_have_text("locked")
    assert tab.locator("[data-model]").count() == 0
    tab.get_by_test_id("key-input").fill("sk-wrong")
    tab.get_by_test_id("key-submit").click()
    expect(tab.locator("#key-reason")).to_contain_text("refused", timeout=WAIT_MS)
    assert tab.locator("[data-model]").count() == 0
    # The key lives in this tab's session storage only: a new context starts without it.
    assert tab.evaluate("() => sessionStorage.getItem('vllm-mlx-api-key')") == "sk-wrong"
    assert tab.evaluate("() => localStorage.length") == 0
    context.close()


def test_the_page_shows_both_models_and_their_states(page: Page, daemon: DaemonProcess) -> None:
    main, spare = page.locator(f'[data-model="{MAIN}"]'), page.locator(f'[data-model="{SPARE}"]')
    expect(main.get_by_test_id("model-state")).to_have_text("running")
    if _model_state(daemon, SPARE) == "not_loaded":  # another test may have loaded it
        expect(spare.get_by_test_id("model-state")).to_have_text("on demand")
    expect(page.get_by_test_id("overall")).to_have_text("running")
    expect(page.get_by_test_id("config")).to_contain_text(str(daemon.config_path))
    server = page.get_by_test_id("mcp").locator("li", has_text="demo")
    expect(server).to_contain_text("ready", timeout=WAIT_MS)
    expect(server).to_contain_text("tools")
    expect(page.locator("#distributed-card")).to_be_hidden()  # no group configured


def test_load_and_unload_buttons(page: Page, daemon: DaemonProcess) -> None:
    spare = page.locator(f'[data-model="{SPARE}"]')
    if _model_state(daemon, SPARE) != "running":
        spare.locator('[data-action="load"]').click()
        expect(spare).to_have_attribute("data-state", "running", timeout=WAIT_MS)
    assert _model_state(daemon, SPARE) == "running"
    spare.locator('[data-action="unload"]').click()
    expect(spare).to_have_attribute("data-state", "on_demand", timeout=WAIT_MS)
    assert _model_state(daemon, SPARE) == "not_loaded"


def test_a_streamed_chat_shows_tokens_arriving(page: Page) -> None:
    page.get_by_test_id("chat-model").select_option(MAIN)

    def fewer_tokens(route: Route) -> None:
        """The page asks for up to 512 tokens; a few dozen show the stream as well.
        Greedy, so the answer's length does not depend on a draw: a sampled one can end
        after a few tokens, which a loaded browser may read in one piece (round 19's CI
        saw an 11-character answer); this prompt's greedy answer runs all 48. Only the
        request is rewritten: the response streams to the page untouched."""
        body = json.loads(route.request.post_data or "{}")
        assert body["stream"] is True and body["max_tokens"] == 512
        route.continue_(post_data=json.dumps({**body, "max_tokens": 48, "temperature": 0}))

    page.route("**/v1/chat/completions", fewer_tokens)
    # Record every length the answer's text takes as it is rendered.
    page.evaluate(
        """() => {
          window.answerLengths = [];
          new MutationObserver(() => {
            const answer = document.querySelector('#chat-log .msg.assistant:last-child');
            if (answer) window.answerLengths.push(answer.textContent.length);
          }).observe(document.getElementById('chat-log'),
                     {childList: true, subtree: true, characterData: true});
        }"""
    )
    page.get_by_test_id("chat-input").fill("Write a long story about a dragon.")
    page.get_by_test_id("chat-send").click()
    expect(page.get_by_test_id("chat-stats")).to_contain_text("TTFT", timeout=WAIT_MS)
    answer = page.locator("#chat-log .msg.assistant")
    assert answer.count() == 1 and answer.inner_text().strip()
    lengths = [n for n in page.evaluate("() => window.answerLengths") if n > 0]
    assert len(set(lengths)) > 1, f"the answer arrived in one piece: {lengths}"
    assert lengths == sorted(lengths)  # it only grew


def test_a_running_request_appears_in_the_live_table(page: Page, daemon: DaemonProcess) -> None:
    stop = threading.Event()
    body = {
        "model": MAIN,
        "messages": [{"role": "user", "content": "Write a long story."}],
        "max_tokens": 4000,
        "logit_bias": NO_EOS,
        "stream": True,
    }

    def stream() -> None:
        headers = {"Authorization": f"Bearer {KEY}"}
        url = f"{daemon.base_url}/v1/chat/completions"
        with httpx.stream("POST", url, json=body, headers=headers, timeout=300) as response:
            for _ in response.iter_lines():
                if stop.is_set():
                    return  # leaving the block closes the connection: the daemon aborts it

    worker = threading.Thread(target=stream, daemon=True)
    worker.start()
    try:
        row = page.get_by_test_id("live").locator("tbody tr").first
        expect(row).to_contain_text(MAIN, timeout=WAIT_MS)
        expect(row).to_contain_text("generation", timeout=WAIT_MS)
        assert _status(daemon)["num_running"] >= 1
    finally:
        stop.set()
        worker.join(timeout=120)
    wait_for(lambda: _status(daemon)["num_running"] == 0, 120, "the aborted request to end")
    expect(page.locator("#live-empty")).to_be_visible(timeout=WAIT_MS)


def test_reported_text_is_shown_as_text_never_markup(page: Page, daemon: DaemonProcess) -> None:
    # A client names a model that is markup: its 404 lands in the page's recent errors.
    name = '<img src=x onerror="window.pwned=1">'
    headers = {"Authorization": f"Bearer {KEY}"}
    body = {"model": name, "messages": [{"role": "user", "content": "hi"}]}
    refused = httpx.post(f"{daemon.base_url}/v1/chat/completions", json=body, headers=headers)
    assert refused.status_code == 404
    errors = page.get_by_test_id("errors")
    expect(errors).to_contain_text(name, timeout=WAIT_MS)
    assert errors.locator("img").count() == 0
    assert page.evaluate("() => window.pwned") is None


def test_the_page_fits_a_phone(browser: Browser, daemon: DaemonProcess) -> None:
    context = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True)
    tab = context.new_page()
    tab.goto(f"{daemon.base_url}/ui")
    tab.get_by_test_id("key-input").fill(KEY)
    tab.get_by_test_id("key-submit").click()
    expect(tab.locator(f'[data-model="{MAIN}"]')).to_be_visible(timeout=WAIT_MS)
    width = tab.evaluate("() => document.documentElement.scrollWidth")
    assert width <= 390, f"the page is {width} px wide on a 390 px screen"
    context.close()


def _save(daemon: DaemonProcess, settings: dict[str, Any]) -> None:
    """Write the config the way editors do: a new file renamed over the old one."""
    scratch = daemon.config_path.with_suffix(".tmp")
    scratch.write_text(yaml.safe_dump(settings, sort_keys=False))
    os.replace(scratch, daemon.config_path)


def test_a_failed_reload_shows_its_error(page: Page, daemon: DaemonProcess) -> None:
    good = yaml.safe_load(daemon.config_path.read_text())
    bad = {**good, "server": {**good["server"], "timeout": -5}}
    _save(daemon, bad)
    try:
        error = page.get_by_test_id("config-error")
        expect(error).to_contain_text("server.timeout", timeout=WAIT_MS)
        expect(error).to_contain_text(daemon.config_path.name)
        expect(error).to_contain_text(re.compile(r"line \d+|:\d+"))
        expect(page.get_by_test_id("config")).to_contain_text("the running config was kept")
    finally:
        _save(daemon, good)
    expect(page.get_by_test_id("config-error")).to_have_count(0, timeout=WAIT_MS)


def test_root_probe_redirect_and_switch(daemon: DaemonProcess) -> None:
    """Clients keep their probes; a browser goes to the page; `dashboard: false` ends it."""
    url = daemon.base_url
    plain = httpx.get(f"{url}/")
    assert plain.status_code == 200 and plain.text == "Ollama is running"
    assert httpx.head(f"{url}/").status_code == 200
    browser_root = httpx.get(f"{url}/", headers={"Accept": "text/html,*/*;q=0.8"})
    assert browser_root.status_code == 302 and browser_root.headers["location"] == "/ui"
    ui = httpx.get(f"{url}/ui")  # no key: the shell holds no data
    assert ui.status_code == 200 and ui.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in ui.headers["content-security-policy"]
    assert httpx.head(f"{url}/ui").status_code == 200
    assert httpx.get(f"{url}/ui/dashboard.js").status_code == 200
    assert httpx.get(f"{url}/ui/../v1/status").status_code == 401  # no side door
    assert httpx.get(f"{url}/ui/secrets.yaml").status_code == 401  # not an asset: needs a key
    missing = httpx.get(f"{url}/ui/secrets.yaml", headers={"Authorization": f"Bearer {KEY}"})
    assert missing.status_code == 404

    good = yaml.safe_load(daemon.config_path.read_text())
    _save(daemon, {**good, "server": {**good["server"], "dashboard": False}})
    try:
        wait_for(lambda: httpx.get(f"{url}/ui").status_code == 404, 60, "the page to go")
        assert "server.dashboard" in httpx.get(f"{url}/ui").json()["error"]["message"]
        html = httpx.get(f"{url}/", headers={"Accept": "text/html"})
        assert html.status_code == 200 and html.text == "Ollama is running"
    finally:
        _save(daemon, good)
    wait_for(lambda: httpx.get(f"{url}/ui").status_code == 200, 60, "the page to return")
