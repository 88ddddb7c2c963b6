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
5-13% slower eager than conservative (round 20).
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

_chosen: PoolPolicy | None = None


def apply(policy: PoolPolicy) -> None:
    ext = qmm.extension()
    ext.set_parallel_min(policy.parallel_min)
    ext.set_worker_spin_us(policy.worker_spin_us)


def chosen() -> PoolPolicy | None:
    """The policy this process measured and applied (None: not measured)."""
    return _chosen


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


def choose(model: Any) -> PoolPolicy | None:
    """Measure and apply the faster policy for this process, once, on a model that runs on
    the kernel; the policy in force (None where the extension is not in use)."""
    global _chosen
    if _chosen is not None or not qmm.status().available or not qmm.uses_kernel(model):
        return _chosen
    if not hasattr(qmm.extension(), "set_worker_spin_us"):  # an older build
        return None
    started = time.perf_counter()
    try:
        samples = measure(model)
    except Exception as error:  # a model this probe cannot drive: keep the defaults
        apply(CONSERVATIVE)
        log.warning("kernel pool policy not measured", error=repr(error))
        _chosen = CONSERVATIVE
        return _chosen
    _chosen = CONSERVATIVE if samples is None else faster(samples)
    apply(_chosen)
    log.info(
        "kernel pool policy",
        policy=_chosen.name,
        parallel_min=_chosen.parallel_min,
        worker_spin_us=_chosen.worker_spin_us,
        ms_a_step=None
        if samples is None
        else {p.name: [round(s * 1000, 2) for s in v] for p, v in samples.items()},
        seconds=round(time.perf_counter() - started, 2),
    )
    return _chosen
