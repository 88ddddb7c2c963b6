"""The `distributed` section's checks and the step-sync message format (no mlx group)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from vllm_mlx.config.settings import Settings
from vllm_mlx.distributed.wire import Message, RequestRebuilder, add_op, decode, encode
from vllm_mlx.engine.types import GenerationRequest, SamplingParams, SharedPrefill


def _settings(distributed: dict[str, Any], **extra: Any) -> Settings:
    return Settings.model_validate({"distributed": distributed, **extra})


def _hostfile(tmp_path: Path, hosts: Any) -> Path:
    path = tmp_path / "hosts.json"
    path.write_text(json.dumps(hosts))
    return path


def test_off_by_default_and_on_with_local_ranks() -> None:
    assert not Settings().distributed.enabled
    on = _settings({"ranks": 3})
    assert on.distributed.enabled and on.distributed.size == 3


def test_a_valid_hostfile_sets_the_size(tmp_path: Path) -> None:
    hosts = [{"ssh": f"m{i}", "ips": [f"10.0.0.{i}"]} for i in range(4)]
    settings = _settings({"hostfile": str(_hostfile(tmp_path, hosts))})
    assert settings.distributed.size == 4


@pytest.mark.parametrize(
    ("section", "hosts", "message"),
    [
        ({"ranks": 0}, None, "greater than or equal to 1"),
        ({"ranks": 17}, None, "less than or equal to 16"),
        ({"ranks": 2, "hostfile": "HOSTS"}, [{"ssh": "a"}, {"ssh": "b"}], "not both"),
        ({"hostfile": "/nonexistent/hosts.json"}, None, "cannot read the hostfile"),
        ({"hostfile": "HOSTS"}, [{"ssh": "a", "ips": ["1.2.3.4"]}], "2 to 16 hosts"),
        ({"hostfile": "HOSTS"}, [{"ssh": "a"}, {"ssh": "b"}], "needs `ips`"),
        ({"hostfile": "HOSTS"}, [{"ips": []}, {"ssh": "b"}], "no `ssh`"),
        ({"hostfile": "HOSTS"}, {"not": "a list"}, "must be a list"),
        ({"backend": "jaccl", "ranks": 2}, None, "jaccl needs a hostfile"),
        ({"backend": "nccl", "ranks": 2}, None, "'ring', 'jaccl' or 'mpi'"),
        ({"strategy": "data", "ranks": 2}, None, "'tensor' or 'pipeline'"),
        ({"step_timeout": 0, "ranks": 2}, None, "greater than 0"),
    ],
)
def test_bad_sections_are_refused(
    tmp_path: Path, section: dict[str, Any], hosts: Any, message: str
) -> None:
    if section.get("hostfile") == "HOSTS":
        section = {**section, "hostfile": str(_hostfile(tmp_path, hosts))}
    with pytest.raises(ValidationError, match=message):
        _settings(section)


def test_a_hostfile_that_is_not_json_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "hosts.json"
    path.write_text("m1\nm2\n")
    with pytest.raises(ValidationError, match="is not JSON"):
        _settings({"hostfile": str(path)})


def test_exactly_one_generation_model_and_not_quantized() -> None:
    two = [
        {"name": "a", "source": "builtin:smollm2-135m-instruct"},
        {"name": "b", "source": "builtin:smollm2-135m-instruct"},
    ]
    with pytest.raises(ValidationError, match="exactly one generation model"):
        _settings({"ranks": 3}, models=two)
    quantized = [{"name": "a", "source": "builtin:smollm2-135m-instruct", "dtype": "quantized"}]
    with pytest.raises(ValidationError, match="float32"):
        _settings({"ranks": 3}, models=quantized)
    second = [{"name": "e", "source": "builtin:all-minilm-l6-v2", "task": "embed"}, two[0]]
    with pytest.raises(ValidationError, match="must load at startup"):
        _settings({"ranks": 3}, models=second)
    assert _settings({"ranks": 3}, models=[{**second[1], "load": "startup"}, second[0]])
    with pytest.raises(ValidationError, match="keep_alive: -1"):
        _settings({"ranks": 3}, models=[{**two[0], "keep_alive": 60}])
    with pytest.raises(ValidationError, match="pin: true"):
        _settings({"ranks": 3}, models=[two[0]], memory={"budget_mb": 4096})
    assert _settings({"ranks": 3}, models=[{**two[0], "pin": True}], memory={"budget_mb": 4096})
    # Without the section the same models are fine.
    assert len(Settings.model_validate({"models": two}).models) == 2


def test_messages_round_trip_and_carry_only_what_followers_need() -> None:
    shared = SharedPrefill(2)
    request = GenerationRequest(
        "r1",
        [1, 2, 3],
        8,
        sampling=SamplingParams(temperature=0.7, seed=5, logit_bias={3: 1.0}),
        logprobs=2,
        shared=shared,
    )
    message = Message(step=True, gather=False, ops=[add_op(request), ["remove", "r0"]])
    back = decode(encode(message))
    assert back == message
    rebuild = RequestRebuilder()
    first = rebuild.request(back.ops[0][1])
    second = rebuild.request(back.ops[0][1])
    assert first.prompt_tokens == [1, 2, 3] and first.max_tokens == 8
    assert not first.sampling.greedy  # the batch's sampler layout is the same as rank 0's
    assert first.sampling.seed is None and first.sampling.logit_bias is None
    assert first.logprobs is None  # rank 0 alone answers the client
    assert first.shared is second.shared and first.shared is not None
    assert first.shared.members == 2
    assert first.ignore_eos is False
    # An ignore_eos row has no stop tokens: every rank must run it alike.
    runs_on = decode(encode(Message(step=True, ops=[add_op(replace(request, ignore_eos=True))])))
    assert rebuild.request(runs_on.ops[0][1]).ignore_eos
