"""Rank 0's hand-over of an engine to the next model's (a reload that re-shards).

A real one-process MLX group (size 1: its all_sum is the identity), so the Leader's
broadcasts run for real; a spy records what the other ranks would receive.
"""

from __future__ import annotations

import threading
from typing import Any

import mlx.core as mx
import pytest

from vllm_mlx.config.distributed import DistributedSettings
from vllm_mlx.distributed.lockstep import RESHARDING, Channel, Leader
from vllm_mlx.distributed.status import GroupStatus
from vllm_mlx.distributed.wire import Message, decode, encode


class SpyChannel(Channel):
    def __init__(self) -> None:
        super().__init__(mx.distributed.init())
        self.sent: list[Message] = []

    def broadcast(self, payload: bytes | None) -> bytes:
        data = super().broadcast(payload)
        self.sent.append(decode(data))
        return data


def _leader() -> tuple[Leader, SpyChannel]:
    channel = SpyChannel()
    status = GroupStatus(0, 1, "ring", "tensor")
    return Leader(channel, DistributedSettings(), status), channel


def test_a_reload_message_round_trips_past_the_first_kilobyte() -> None:
    reload: dict[str, Any] = {"model": {"name": "m", "source": "/x" * 900}, "engine": {}}
    channel = Channel(mx.distributed.init())
    assert decode(channel.broadcast(encode(Message(reload=reload)))).reload == reload
    assert decode(encode(Message(step=True))).reload is None


def test_the_hand_over_waits_for_the_batch_then_tells_the_ranks_once() -> None:
    leader, channel = _leader()
    reload = {"model": {"name": "next"}, "engine": {}, "cache_dir": "/c"}
    handing = threading.Thread(target=leader.hand_over, args=(reload,))
    handing.start()
    while leader._handover is None:  # the loader's thread has asked
        handing.join(0.01)
    assert leader.closed == RESHARDING  # new requests are refused (the API's 503)
    leader.exchange(step=True)  # in-flight sequences still step on the old model
    assert handing.is_alive()
    assert channel.sent[-1].step and channel.sent[-1].reload is None
    leader.exchange(step=False)  # idle: now the ranks move on
    handing.join(10)
    assert not handing.is_alive()
    assert channel.sent[-1].reload == reload
    count = len(channel.sent)
    leader.exchange(step=False)  # retired: no heartbeat competes with the next Leader's
    leader.stopped()  # stopping the old engine does not stop the group
    assert len(channel.sent) == count


def test_a_stopped_engine_cannot_hand_over() -> None:
    leader, channel = _leader()
    leader.stopped()  # e.g. an explicit unload: the followers were told to exit
    assert channel.sent[-1].stop
    with pytest.raises(RuntimeError, match="restart the service"):
        leader.hand_over({"model": {}})
