"""docs/grafana-dashboard.json imports into Grafana and queries only metrics the daemon exposes."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from vllm_mlx.metrics.core import Metrics
from vllm_mlx.metrics.live import MemorySample, ModelSample

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana-dashboard.json"
METRIC_NAME = re.compile(r"\b(vllm(?::|_mlx_)[A-Za-z0-9_:]+)")


def exposed_names() -> set[str]:
    """Every sample name a daemon's /metrics shows (counters' _total, histograms' _bucket...)."""
    metrics = Metrics()
    metrics.add_model("m")
    metrics.watch(lambda: ([ModelSample("m", "running")], MemorySample()))
    # HTTP series carry route labels, so they exist once a first request was answered
    # (any daemon that has been scraped once).
    metrics.http_request("/health", "GET", 200, 0.001)
    return {
        sample.name
        for family in text_string_to_metric_families(metrics.render().decode())
        for sample in family.samples
    }


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def queries(board: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            exprs.append(variable["query"]["query"])
    return exprs


def test_every_queried_metric_is_exposed() -> None:
    names = exposed_names()
    used = {name for expr in queries(dashboard()) for name in METRIC_NAME.findall(expr)}
    assert used, "the dashboard queries no vllm metric"
    missing = sorted(used - names)
    assert not missing, f"the dashboard queries metrics the daemon does not expose: {missing}"


def test_the_dashboard_covers_the_main_families() -> None:
    text = " ".join(queries(dashboard()))
    for name in ("vllm:time_to_first_token_seconds_bucket", "vllm:generation_tokens_total",
                 "vllm:num_requests_running", "vllm_mlx_memory_active_bytes",
                 "vllm_mlx_http_requests_total"):  # fmt: skip
        assert name in text


def test_the_dashboard_is_importable() -> None:
    board = dashboard()
    assert board["title"] and board["uid"] and isinstance(board["schemaVersion"], int)
    assert [i["name"] for i in board["__inputs"]] == ["DS_PROMETHEUS"]
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24 and grid["h"] > 0
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${DS_PROMETHEUS}"
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs))
