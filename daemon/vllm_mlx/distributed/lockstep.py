"""The per-step exchange between ranks, over the MLX group itself (no transport of ours).

Protocol, every engine-loop iteration on rank 0 (and every `heartbeat` seconds idle):
1. rank 0 broadcasts a Message (wire.py): the batch changes since the last one and
   whether a step follows. A broadcast is an `all_sum` of a 1 KiB uint8 buffer where
   the other ranks add zeros (a longer message takes a second all_sum for the rest).
2. every rank applies the changes to its own Scheduler and runs the same step. In the
   step, the sharded model's own collectives keep the ranks together; its logits are
   the same on every rank (an all_sum's result is).
3. rank 0 samples (its processors, grammars, penalties, seeds) and shares: each sampler
   is wrapped in an all_sum where the other ranks add zeros, so every rank feeds the
   exact same tokens into the next step. The zeros are made from the step's logits,
   so each rank evaluates its collectives in the same order (model first).
Every GATHER_EVERY messages the ranks also all_sum their step and exchange times.
A model reload ends an engine's exchanges with a reload message (Leader.hand_over).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import mlx.core as mx
import numpy as np
import structlog
from mlx_lm.generate import generation_stream

from vllm_mlx.config.distributed import DistributedSettings
from vllm_mlx.distributed.status import GroupStatus
from vllm_mlx.distributed.wire import Message, add_op, decode, encode, remove_op
from vllm_mlx.engine.types import GenerationRequest

log = structlog.get_logger(__name__)

HEAD = 1024  # bytes of the first broadcast: 4 for the length, the rest inline payload
GATHER_EVERY = 16
GROUP_FAILED_EXIT = 70  # EX_SOFTWARE: the service manager restarts the group
RESHARDING = "the distributed model is being re-sharded for a reload; retry in a moment"
EXIT_GRACE_S = 1.0  # for the HTTP side to send the failed requests' error events
EXIT_MARKER = "VLLM_MLX_RANK0_EXIT="

Sampler = Callable[[Any], Any]


class GroupFailedError(RuntimeError):
    pass


class Channel:
    """Broadcast and gather over one mx.distributed group."""

    def __init__(self, group: Any) -> None:
        self.group = group
        self.rank: int = group.rank()
        self.size: int = group.size()

    def _sum(self, values: np.ndarray) -> np.ndarray:
        # On mlx-lm's generation stream, behind the step it may still be computing
        # (BatchGenerator evaluates the next step asynchronously): on another stream
        # this collective would interleave with the model's own on the same sockets.
        with mx.stream(generation_stream):
            total = mx.distributed.all_sum(mx.array(values), group=self.group)
            return np.array(total)

    def broadcast(self, payload: bytes | None) -> bytes:
        """Rank 0 passes the bytes, the others None; every rank returns them."""
        head = np.zeros(HEAD, np.uint8)
        if payload is not None:
            inline = payload[: HEAD - 4]
            head[:4] = np.frombuffer(len(payload).to_bytes(4, "little"), np.uint8)
            head[4 : 4 + len(inline)] = np.frombuffer(inline, np.uint8)
        out = self._sum(head)
        length = int.from_bytes(out[:4].tobytes(), "little")
        data = out[4 : 4 + min(length, HEAD - 4)].tobytes()
        if length > HEAD - 4:
            rest = length - (HEAD - 4)
            tail = (
                np.zeros(rest, np.uint8)
                if payload is None
                else np.frombuffer(payload[HEAD - 4 :], np.uint8)
            )
            data += self._sum(tail).tobytes()
        return data

    def gather(self, row: list[float]) -> list[list[float]]:
        """Every rank's row, on every rank."""
        table = np.zeros((self.size, len(row)), np.float32)
        table[self.rank] = row
        return [[float(v) for v in r] for r in self._sum(table)]


class Watchdog:
    """Fires `on_expire` once when an armed wait lasts past `timeout`, or when the
    launcher (our parent, mlx.launch) is gone. MLX collectives can block forever on a
    peer that stops answering; this is what bounds them."""

    def __init__(self, timeout: float, on_expire: Callable[[str], None]) -> None:
        self.timeout = timeout
        self._on_expire = on_expire
        self._since: float | None = None
        self._closed = False
        self._parent = os.getppid()
        self._thread = threading.Thread(target=self._run, name="group-watchdog", daemon=True)
        self._thread.start()

    def arm(self) -> None:
        self._since = time.monotonic()

    def disarm(self) -> None:
        self._since = None

    def close(self) -> None:
        """For good (its engine handed over to the next model's): the thread ends."""
        self._since = None
        self._closed = True

    def _run(self) -> None:
        poll = min(0.25, self.timeout / 4)
        while not self._closed:
            time.sleep(poll)
            since = self._since
            if since is not None and time.monotonic() - since > self.timeout:
                self._on_expire(f"no rank answered within {self.timeout:g} s")
                return
            if os.getppid() != self._parent:
                self._on_expire("the launcher (mlx.launch) exited")
                return


def report_exit(code: int) -> None:
    """Rank 0's exit status, on stdout for the launcher: mlx.launch itself exits 0."""
    sys.stdout.write(f"\n{EXIT_MARKER}{code}\n")
    sys.stdout.flush()


class _Ranked:
    """What both sides share: the channel, the time window, the watchdog."""

    def __init__(self, channel: Channel, settings: DistributedSettings, timeout: float) -> None:
        self.channel = channel
        self.settings = settings
        self.window = [0.0, 0.0, 0.0]  # steps, step seconds, sync seconds
        self._step_started: float | None = None
        self.watchdog = Watchdog(timeout, self._expired)

    def _expired(self, why: str) -> None:
        raise NotImplementedError

    def _step_done(self, now: float) -> None:
        if self._step_started is not None:
            self.window[0] += 1
            self.window[1] += now - self._step_started
            self._step_started = None

    def _gather(self) -> list[list[float]]:
        rows = self.channel.gather(self.window)
        self.window = [0.0, 0.0, 0.0]
        return rows


class Leader(_Ranked):
    """Rank 0's Lockstep (engine/scheduler.py): journal, exchange, shared sampling."""

    def __init__(
        self, channel: Channel, settings: DistributedSettings, status: GroupStatus
    ) -> None:
        super().__init__(channel, settings, settings.step_timeout)
        self.idle_interval: float | None = settings.heartbeat
        self.status = status
        self._ops: list[list[Any]] = []
        self._count = 0
        self._shared: Sampler | None = None
        self._fail_in_flight: Callable[[str], None] = lambda message: None
        self.closed: str | None = None
        self._handover: tuple[dict[str, Any], threading.Event] | None = None
        self._retired = False  # handed over to the next model's Leader, or stopped
        self._stopped = False  # stopped: the other ranks were told to exit

    def hand_over(self, reload: dict[str, Any]) -> None:
        """From the loader's thread: close this engine to new requests (503), let the
        in-flight ones finish, then (from the engine thread, idle) tell the other ranks
        to load `reload`; return once told. This Leader exchanges nothing after that."""
        done = threading.Event()
        self._check_alive()
        self.status.state = "reloading"
        self.closed = RESHARDING
        self._handover = (reload, done)
        while not done.wait(0.25):
            self._check_alive()

    def _check_alive(self) -> None:
        if self.status.failed:
            raise GroupFailedError(self.status.error or "the distributed group failed")
        if self._stopped:
            raise RuntimeError(
                "the distributed model's engine has stopped (the other ranks exited); "
                "restart the service to load a model"
            )

    def bind(self, fail_in_flight: Callable[[str], None]) -> None:
        self._fail_in_flight = fail_in_flight

    def added(self, request: GenerationRequest) -> None:
        self._ops.append(add_op(request))
        if request.shared is not None or request.prompt_logprobs is not None:
            # The scheduler runs this request's prefill right now, outside a step: the
            # other ranks must join that forward pass (and its collectives) at once.
            self._send(step=False, busy=True)

    def removed(self, request_id: str) -> None:
        self._ops.append(remove_op(request_id))

    def exchange(self, step: bool) -> None:
        if self._retired:
            return  # the followers serve the next model's Leader now
        if self._handover is not None and not step:  # idle: nothing left in flight
            self._send_reload(*self._handover)
            return
        self._send(step, busy=step)

    def _send_reload(self, reload: dict[str, Any], done: threading.Event) -> None:
        self.watchdog.arm()
        try:
            self.channel.broadcast(encode(Message(reload=reload)))
        except Exception as exc:
            self._fail(f"sending the reload: {exc}")
            raise
        finally:
            self.watchdog.disarm()
        self.watchdog.close()  # the next model's Leader has its own
        self._retired = True
        done.set()

    def _send(self, step: bool, busy: bool) -> None:
        if self.status.failed:
            raise GroupFailedError(self.status.error or "the distributed group failed")
        started = time.monotonic()
        self._step_done(started)
        self.watchdog.arm()
        self._count += 1
        # Times travel every GATHER_EVERY messages, and as soon as a busy stretch ends.
        gather = self._count % GATHER_EVERY == 0 or (not step and self.window[0] > 0)
        message = Message(step=step, gather=gather, ops=self._ops)
        self._ops = []
        self.channel.broadcast(encode(message))
        if message.gather:
            self.status.update_times([(r[0], r[1], r[2]) for r in self._gather()])
        done = time.monotonic()
        self.window[2] += done - started
        if step:
            self._step_started = done
        if not busy:  # otherwise it stays armed over the step or prefill that follows
            self.watchdog.disarm()

    def wrap_sampler(self, sampler: Sampler, shared: bool) -> Sampler:
        if shared and self._shared is not None:
            return self._shared
        group = self.channel.group

        def share(logprobs: Any) -> Any:
            tokens = sampler(logprobs).astype(mx.int32).reshape(-1)
            return mx.distributed.all_sum(tokens, group=group)

        if shared:
            self._shared = share
        return share

    def failed(self, message: str) -> None:
        self._fail(message)

    def stopped(self) -> None:
        """The engine stopped (drain finished): tell the other ranks to exit."""
        self.watchdog.disarm()
        if self.status.failed or self._retired:
            return  # (retired: an old model's engine; the group goes on with the next)
        self._retired = self._stopped = True
        self.watchdog.arm()  # the goodbye is an exchange too
        try:
            self.channel.broadcast(encode(Message(stop=True)))
        except Exception as exc:
            self._fail(f"stopping the group: {exc}")
            return
        self.watchdog.disarm()
        self.status.state = "stopped"

    def _expired(self, why: str) -> None:
        self._fail(why)

    def _fail(self, message: str) -> None:
        text = f"distributed group failed: {message}"
        if not self.status.fail(text):
            return
        log.error("distributed group failed; failing in-flight requests and exiting", error=text)
        self._fail_in_flight(text)
        threading.Thread(target=_exit_soon, name="group-exit", daemon=True).start()


def _exit_soon() -> None:
    time.sleep(EXIT_GRACE_S)
    report_exit(GROUP_FAILED_EXIT)
    os._exit(GROUP_FAILED_EXIT)


class Follower(_Ranked):
    """Ranks 1..N-1: receive rank 0's messages, use rank 0's tokens."""

    idle_interval: float | None = None
    closed: str | None = None

    def __init__(self, channel: Channel, settings: DistributedSettings) -> None:
        # Rank 0 speaks at least every heartbeat while idle, every step while busy.
        super().__init__(channel, settings, settings.step_timeout + settings.heartbeat)
        self._shared: Sampler | None = None

    def receive(self) -> Message:
        now = time.monotonic()
        self._step_done(now)
        self.watchdog.arm()
        message = decode(self.channel.broadcast(None))
        if message.gather:
            self._gather()
        self.window[2] += time.monotonic() - now
        if message.step:
            self._step_started = time.monotonic()
        return message

    def wrap_sampler(self, sampler: Sampler, shared: bool) -> Sampler:
        if shared and self._shared is not None:
            return self._shared
        group = self.channel.group

        def follow(logprobs: Any) -> Any:
            zeros = (mx.argmax(logprobs, axis=-1) * 0).astype(mx.int32).reshape(-1)
            return mx.distributed.all_sum(zeros, group=group)

        if shared:
            self._shared = follow
        return follow

    # The Lockstep methods only rank 0 uses.
    def bind(self, fail_in_flight: Callable[[str], None]) -> None:
        pass

    def added(self, request: GenerationRequest) -> None:
        pass

    def removed(self, request_id: str) -> None:
        pass

    def exchange(self, step: bool) -> None:
        pass

    def failed(self, message: str) -> None:
        self._expired(message)

    def stopped(self) -> None:
        pass

    def _expired(self, why: str) -> None:
        log.error("distributed group failed; this rank exits", rank=self.channel.rank, error=why)
        os._exit(GROUP_FAILED_EXIT)
