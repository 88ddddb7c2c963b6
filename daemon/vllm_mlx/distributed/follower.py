"""The loop of ranks 1..N-1: apply rank 0's batch changes, run the same step.

The follower drives the same Scheduler as rank 0 (same BatchGenerator, prefix cache
and shared prefills, so the same forward passes in the same order), fed by messages
instead of HTTP requests. Its samplers take rank 0's tokens (lockstep.Follower).
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

import structlog

from vllm_mlx.distributed.lockstep import Follower
from vllm_mlx.distributed.wire import RequestRebuilder
from vllm_mlx.engine.scheduler import Scheduler
from vllm_mlx.engine.scheduler_state import AbortCommand, AddCommand
from vllm_mlx.engine.types import EngineEvent, FinishReason, SequenceFinished, TokensGenerated

log = structlog.get_logger(__name__)


class _Tokens:
    """A follower's own record of one sequence: logged when it ends, so a test (or an
    operator) can check every rank produced rank 0's tokens."""

    def __init__(self, request_id: str, tokenizer: Any) -> None:
        self.request_id = request_id
        self.tokenizer = tokenizer
        self.tokens: list[int] = []

    def __call__(self, event: EngineEvent) -> None:
        if isinstance(event, TokensGenerated):
            self.tokens.extend(event.tokens)
        elif isinstance(event, SequenceFinished):
            digest = hashlib.sha256(str(self.tokens).encode()).hexdigest()[:16]
            log.info(
                "follower sequence finished",
                request_id=self.request_id,
                tokens=len(self.tokens),
                digest=digest,
                text=self.tokenizer.decode(self.tokens),
                reason=event.reason.value,
            )


def follow(scheduler: Scheduler, follower: Follower, tokenizer: Any) -> int | dict[str, Any]:
    """Run until rank 0's stop message (0), a failure (70; the watchdog exits 70 too),
    or a reload message: then return its settings (the next model to load)."""
    scheduler._generator = scheduler._make_generator()
    rebuild = RequestRebuilder()
    log.info("following rank 0", pid=os.getpid())
    while True:
        try:
            message = follower.receive()
        except Exception as exc:  # rank 0 gone: its socket closed
            follower.failed(f"receiving from rank 0: {exc}")
            return 70
        if message.stop:
            log.info("rank 0 stopped the group")
            follower.watchdog.disarm()
            return 0
        if message.reload is not None:
            log.info("rank 0 reloads the model", model=message.reload["model"].get("name"))
            follower.watchdog.close()  # loading takes as long as it takes; then a new one
            return message.reload
        for kind, body in message.ops:
            if kind == "add":
                request = rebuild.request(body)
                scheduler._add(AddCommand(request, _Tokens(request.request_id, tokenizer)))
            elif kind == "remove":
                scheduler._abort(AbortCommand(str(body), FinishReason.ABORT, ""))
        if message.step and scheduler._slots:
            try:
                scheduler._step()
            except Exception as exc:
                follower.failed(f"step failed: {exc}")
                return 70
