"""How eagerly the extension's thread pool splits small work, chosen by measuring it.

A one-row decode step of a small model is ~200 small products: a layer's q/k/v and o
products, its attention. Below `parallel_min` of work a product stays on the calling
thread, and an idle worker spins `worker_spin_us` for the next job before it sleeps on a
futex. Two policies:

- conservative (the extension's defaults): small products stay on one thread and a
  worker sleeps after 3 us, leaving the other core to the Python thread that builds the
  next step's graph meanwhile;
- eager: every product splits and a worker spins 30 us (3 on pause instructions, then
  yielding the core between checks), so the next product of the layer finds it awake
  instead of paying a futex wake.

Which is faster depends on the machine. On an AMD EPYC (Zen 3, rounds 15-16) spinning
and splitting the small products made a one-row step slower in-process (11.1-12.7 ->
12.2-13.7 ms); on an Intel Xeon (round 20) eager was 1.15x a stream over HTTP and 1.09x
at 16 streams (docs/benchmarks.md). So the loader measures: a few blocks of pipelined
one-row decode steps of the loaded model under each policy, alternating so that load
drift favours neither, and keeps eager only when its median step is clearly faster.
Both policies compute every output row the same way (the split assigns rows to threads,
never changes a row's arithmetic), so the choice changes speed, never tokens.

Measured once per process (the pool is the process's), on the first model that runs on
the kernel; a model whose step is slow is made of products that split under both
policies, and keeps the defaults unmeasured. What the measurement cannot see is a CPU
that becomes shared later: two daemons decoding side by side on the Xeon's two cores ran
5-13% slower eager than conservative (round 20). `engine.kernel_pool` names a policy for
such a machine (or any other), and then nothing is measured.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import structlog
from mlx_lm.models.cache import make_prompt_cache

from vllm_mlx.models.cpu import qmm

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class PoolPolicy:
    name: str
    parallel_min: int  # work (output rows x inputs x (rows + 2)) below which one thread runs
    worker_spin_us: int  # an idle worker's spin before it sleeps


CONSERVATIVE = PoolPolicy("conservative", 1 << 21, 3)
EAGER = PoolPolicy("eager", 0, 30)
MARGIN = 0.03  # eager must be this much faster: within noise the defaults stay
SLOW_STEP_S = 0.05  # a one-row step this slow splits its products either way
WARM_STEPS = 4
BLOCK_STEPS = 8
ROUNDS = 3

BY_NAME = {policy.name: policy for policy in (CONSERVATIVE, EAGER)}
CONFIG_KEY = "engine.kernel_pool"


@dataclass(frozen=True)
class Decision:
    policy: PoolPolicy
    chosen_by: str  # "measured" or CONFIG_KEY
    ms_a_step: dict[str, list[float]] | None = None  # the measurement's blocks


_measured: Decision | None = None  # `auto`'s result: measured once a process
_in_force: Decision | None = None


def apply(policy: PoolPolicy) -> None:
    ext = qmm.extension()
    ext.set_parallel_min(policy.parallel_min)
    ext.set_worker_spin_us(policy.worker_spin_us)


def chosen() -> PoolPolicy | None:
    """The policy in force in this process (None: neither measured nor configured)."""
    return None if _in_force is None else _in_force.policy


def describe() -> dict[str, Any] | None:
    """The policy in force and how it was chosen, for /v1/status."""
    if _in_force is None:
        return None
    return {
        "policy": _in_force.policy.name,
        "chosen_by": _in_force.chosen_by,
        "ms_a_step": _in_force.ms_a_step,
    }


def faster(samples: Mapping[PoolPolicy, Sequence[float]]) -> PoolPolicy:
    """Eager when its median seconds a step is under (1 - MARGIN) of the conservative's."""
    eager, conservative = (statistics.median(samples[p]) for p in (EAGER, CONSERVATIVE))
    return EAGER if eager < conservative * (1 - MARGIN) else CONSERVATIVE


def _next_token(model: Any, cache: list[Any], token: mx.array) -> mx.array:
    logits = model(token, cache=cache)[:, -1, :]
    return mx.argmax(logits, axis=-1, keepdims=True)


def _seconds_a_step(
    model: Any, cache: list[Any], token: mx.array, steps: int
) -> tuple[float, mx.array]:
    """Mean seconds of `steps` greedy one-row steps, pipelined as mlx-lm's generator runs
    them (the next step's graph is built while this one computes); the last token."""
    started = time.perf_counter()
    pending = _next_token(model, cache, token)
    mx.async_eval(pending)
    for _ in range(steps - 1):
        following = _next_token(model, cache, pending)
        mx.async_eval(following)
        mx.eval(pending)
        pending = following
    mx.eval(pending)
    return (time.perf_counter() - started) / steps, pending


def measure(model: Any) -> dict[PoolPolicy, list[float]] | None:
    """Seconds a step under each policy, ROUNDS blocks each, alternating; None when a warm
    step is slower than SLOW_STEP_S (nothing to choose between)."""
    cache = make_prompt_cache(model)
    apply(CONSERVATIVE)
    warm, token = _seconds_a_step(model, cache, mx.array([[0]]), WARM_STEPS)
    if warm > SLOW_STEP_S:
        return None
    samples: dict[PoolPolicy, list[float]] = {CONSERVATIVE: [], EAGER: []}
    for round_ in range(ROUNDS):
        order = (EAGER, CONSERVATIVE) if round_ % 2 else (CONSERVATIVE, EAGER)
        for policy in order:
            apply(policy)
            seconds, token = _seconds_a_step(model, cache, token, BLOCK_STEPS)
            samples[policy].append(seconds)
    return samples


def choose(model: Any, setting: str = "auto") -> PoolPolicy | None:
    """Apply `engine.kernel_pool`: a named policy as it is, or for `auto` the faster one,
    measured once a process on the first model that runs on the kernel (a later `auto`
    load re-applies that measurement). The policy in force (None: the extension is not in
    use, or an older build without the setting)."""
    global _measured, _in_force
    if not qmm.status().available or not hasattr(qmm.extension(), "set_worker_spin_us"):
        return None
    if setting != "auto":
        _in_force = Decision(BY_NAME[setting], CONFIG_KEY)
        apply(_in_force.policy)
        log.info("kernel pool policy", policy=setting, chosen_by=CONFIG_KEY)
        return _in_force.policy
    if _measured is None:
        if not qmm.uses_kernel(model):
            return chosen()
        _measured = _measure_decision(model)
    _in_force = _measured
    apply(_measured.policy)
    return _measured.policy


def _measure_decision(model: Any) -> Decision:
    started = time.perf_counter()
    try:
        samples = measure(model)
    except Exception as error:  # a model this probe cannot drive: keep the defaults
        log.warning("kernel pool policy not measured", error=repr(error))
        return Decision(CONSERVATIVE, "measured")
    policy = CONSERVATIVE if samples is None else faster(samples)
    ms_a_step = (
        None
        if samples is None
        else {p.name: [round(s * 1000, 2) for s in v] for p, v in samples.items()}
    )
    log.info(
        "kernel pool policy",
        policy=policy.name,
        chosen_by="measured",
        parallel_min=policy.parallel_min,
        worker_spin_us=policy.worker_spin_us,
        ms_a_step=ms_a_step,
        seconds=round(time.perf_counter() - started, 2),
    )
    return Decision(policy, "measured", ms_a_step)
