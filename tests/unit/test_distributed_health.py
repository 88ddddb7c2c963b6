"""Rank 0's HTTP face of a failed group: /health 503 with the error, /v1/status, /metrics."""

from __future__ import annotations

from litestar.testing import TestClient
from prometheus_client.parser import text_string_to_metric_families

from vllm_mlx.api.state import ServerState
from vllm_mlx.app import create_app
from vllm_mlx.config.settings import Settings
from vllm_mlx.distributed.status import GroupStatus
from vllm_mlx.engine.fleet.registry import ModelRegistry
from vllm_mlx.engine.scheduler import SchedulerConfig


def _state() -> ServerState:
    settings = Settings.model_validate({"metrics": {"enabled": True}})
    state = ServerState(settings, ModelRegistry(settings.models, SchedulerConfig()))
    group = GroupStatus(0, 3, "ring", "tensor", hosts=["a", "b", "c"])
    group.state = "serving"
    group.weight_bytes = [10, 10, 10]
    group.update_times([(4, 2.0, 0.2), (4, 1.9, 0.4), (4, 1.9, 0.4)])
    state.distributed = group
    state.metrics.watch_group(group.metric_rows)
    return state


def test_a_failed_group_is_unhealthy_with_its_error() -> None:
    state = _state()
    assert state.distributed is not None
    with TestClient(create_app(state), base_url="http://127.0.0.1") as client:
        status = client.get("/v1/status").json()["distributed"]
        assert status["state"] == "serving" and status["size"] == 3
        assert [r["host"] for r in status["ranks"]] == ["a", "b", "c"]
        assert status["ranks"][0]["step_ms"] == 500.0  # 2 s over 4 steps
        assert state.distributed.fail("distributed group failed: rank 2 lost")
        assert not state.distributed.fail("again")  # the first error stays
        health = client.get("/health")
        assert health.status_code == 503
        assert health.json()["status"] == "failed"
        assert "rank 2 lost" in health.json()["error"]
        families = {f.name: f for f in text_string_to_metric_families(client.get("/metrics").text)}
        assert families["vllm_mlx_distributed_up"].samples[0].value == 0
        assert len(families["vllm_mlx_distributed_sync_seconds"].samples) == 3
