"""The step-sync message rank 0 broadcasts before every step (and every idle tick).

It carries exactly the batch changes since the last message, in order: requests
added (prompt tokens, max_tokens, whether the sampler is the shared greedy one, and
what makes the engine run extra forward passes: prompt scoring and `n` groups) and
requests removed (aborts, per-request faults). Sampling parameters beyond greedy or
not stay on rank 0: rank 0 samples and every rank uses its token (lockstep.py), so
logit bias, penalties, grammars and seeds never need to travel. JSON: small, and a
rank never unpickles what a peer sent. A reload message (the last of an engine) carries
the next model's settings instead: every rank loads and shards it (rank.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from vllm_mlx.engine.types import GenerationRequest, SamplingParams, SharedPrefill


@dataclass
class Message:
    step: bool = False  # a step follows this message
    gather: bool = False  # every rank reports its times after this message
    stop: bool = False  # the group is stopping: followers exit 0
    ops: list[list[Any]] = field(default_factory=list)
    # The model changed: {"model", "engine", "cache_dir"} for every rank to load and shard.
    reload: dict[str, Any] | None = None


def encode(message: Message) -> bytes:
    body = {
        "s": message.step,
        "g": message.gather,
        "x": message.stop,
        "o": message.ops,
        "r": message.reload,
    }
    return json.dumps(body, separators=(",", ":")).encode()


def decode(data: bytes) -> Message:
    body = json.loads(data)
    reload = body.get("r")
    return Message(
        bool(body["s"]),
        bool(body["g"]),
        bool(body["x"]),
        list(body["o"]),
        None if reload is None else dict(reload),
    )


def add_op(request: GenerationRequest) -> list[Any]:
    shared = request.shared
    return [
        "add",
        {
            "id": request.request_id,
            "tokens": list(request.prompt_tokens),
            "max": request.max_tokens,
            "greedy": request.sampling.greedy,
            "plp": request.prompt_logprobs,
            "ie": request.ignore_eos,  # its row's stop tokens: every rank stops alike
            # id() names the group on rank 0; members arrive in order, like there.
            "shared": None if shared is None else [id(shared), shared.members],
        },
    ]


def remove_op(request_id: str) -> list[Any]:
    return ["remove", request_id]


class RequestRebuilder:
    """Followers' side: the GenerationRequest the engine needs to run the same step."""

    def __init__(self) -> None:
        self._groups: dict[int, SharedPrefill] = {}

    def request(self, body: dict[str, Any]) -> GenerationRequest:
        shared = None
        if body["shared"] is not None:
            key, members = int(body["shared"][0]), int(body["shared"][1])
            shared = self._groups.get(key) or self._groups.setdefault(key, SharedPrefill(members))
            if shared.started + 1 >= shared.members:
                self._groups.pop(key, None)  # its last member: the key may be reused
        return GenerationRequest(
            request_id=str(body["id"]),
            prompt_tokens=[int(t) for t in body["tokens"]],
            max_tokens=int(body["max"]),
            # Only greedy-or-not matters here: it decides the batch's sampler layout.
            sampling=SamplingParams(temperature=0.0 if body["greedy"] else 1.0),
            prompt_logprobs=None if body["plp"] is None else int(body["plp"]),
            shared=shared,
            ignore_eos=bool(body.get("ie", False)),
        )
