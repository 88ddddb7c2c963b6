"""Keys, rate limit, CORS and metrics are hot keys: saving the file applies them at once."""

from __future__ import annotations

import os
from typing import Any

import httpx
import yaml

from tests.conftest import DaemonProcess, StartDaemon
from tests.e2e.ops_support import wait_for


def _save(daemon: DaemonProcess, change: dict[str, Any]) -> None:
    """Rewrite the daemon's config file the way editors do: a new file renamed over it."""
    settings = yaml.safe_load(daemon.config_path.read_text())
    for section, values in change.items():
        settings.setdefault(section, {}).update(values)
    scratch = daemon.config_path.with_suffix(".tmp")
    scratch.write_text(yaml.safe_dump(settings, sort_keys=False))
    os.replace(scratch, daemon.config_path)


def _models(daemon: DaemonProcess, key: str, origin: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}", **({"Origin": origin} if origin else {})}
    return httpx.get(f"{daemon.base_url}/v1/models", headers=headers)


def test_ops_settings_hot_reload(start_daemon: StartDaemon) -> None:
    daemon = start_daemon({"auth": {"api_keys": ["old-key"]}})
    assert _models(daemon, "old-key").status_code == 200
    assert httpx.get(f"{daemon.base_url}/metrics").status_code == 404

    _save(
        daemon,
        {
            "auth": {"api_keys": ["new-key"], "rate_limit": 2},
            "metrics": {"enabled": True},
            "server": {"cors_origins": ["https://app.example"]},
        },
    )
    wait_for(lambda: _models(daemon, "new-key").status_code == 200, 60, "the new key")
    assert _models(daemon, "old-key").status_code == 401
    assert httpx.get(f"{daemon.base_url}/metrics").status_code == 200
    allowed = _models(daemon, "new-key", origin="https://app.example")
    assert allowed.headers["access-control-allow-origin"] == "https://app.example"
    # Two a minute: the first 200 for new-key and the CORS call used them (401s use none).
    assert _models(daemon, "new-key").status_code == 429
