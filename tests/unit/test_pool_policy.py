"""The kernel pool's split policy, measured at load (models/cpu/pool_policy.py): the
faster policy is kept, it reaches the extension, and it changes speed, never bits."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx_lm.models.cache import make_prompt_cache

from tests.support.tiny_model import tiny_llama
from vllm_mlx.cli.main import main
from vllm_mlx.models.cpu import attention, decoder, norms, pool_policy, projections, qmm, swiglu
from vllm_mlx.models.cpu.pool_policy import CONSERVATIVE, EAGER

BUILT = qmm.status().available and hasattr(qmm.extension(), "set_worker_spin_us")
kernel_only = pytest.mark.skipif(not BUILT, reason=f"kernel unavailable: {qmm.status().detail}")


@pytest.fixture
def restored(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The extension's pool settings and the process's measured choice, put back."""
    monkeypatch.setattr(pool_policy, "_measured", None)
    monkeypatch.setattr(pool_policy, "_in_force", None)
    ext = qmm.extension()
    parallel_min, spin, threads = ext.parallel_min(), ext.worker_spin_us(), ext.threads()
    swapped = attention.uses_kernel(tiny_llama())  # kernel_model swaps llama's attention
    yield
    if not swapped:
        attention.restore_attention(tiny_llama())
    ext.set_parallel_min(parallel_min)
    ext.set_worker_spin_us(spin)
    ext.set_threads(threads)


def kernel_model() -> Any:
    """The tiny llama quantized and swapped as apply_dtype swaps a loaded model."""
    model = tiny_llama()
    nn.quantize(model, group_size=32, bits=4)
    qmm.swap_layers(model)
    projections.group_projections(model)
    swiglu.swap_activations(model)
    norms.swap_norms(model)
    attention.swap_attention(model)
    decoder.swap_decoder_layers(model)
    return model


def test_eager_is_kept_only_when_clearly_faster() -> None:
    clearly = {CONSERVATIVE: [0.0110, 0.0104, 0.0108], EAGER: [0.0090, 0.0093, 0.0088]}
    assert pool_policy.faster(clearly) is EAGER
    within_noise = {CONSERVATIVE: [0.0100, 0.0102, 0.0101], EAGER: [0.0099, 0.0100, 0.0098]}
    assert pool_policy.faster(within_noise) is CONSERVATIVE
    slower = {CONSERVATIVE: [0.0100, 0.0100, 0.0100], EAGER: [0.0120, 0.0090, 0.0125]}
    assert pool_policy.faster(slower) is CONSERVATIVE


@kernel_only
def test_the_worker_spin_is_settable_and_never_negative(restored: None) -> None:
    ext = qmm.extension()
    ext.set_worker_spin_us(30)
    assert ext.worker_spin_us() == 30
    ext.set_worker_spin_us(-5)
    assert ext.worker_spin_us() == 0


@kernel_only
def test_the_chosen_policy_reaches_the_extension_measured_once_a_process(
    restored: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = kernel_model()
    chosen = pool_policy.choose(model)
    assert chosen in (CONSERVATIVE, EAGER)
    ext = qmm.extension()
    assert ext.parallel_min() == chosen.parallel_min
    assert ext.worker_spin_us() == chosen.worker_spin_us
    status = pool_policy.describe()
    assert status is not None
    assert status["policy"] == chosen.name and status["chosen_by"] == "measured"
    assert sorted(status["ms_a_step"]) == ["conservative", "eager"]
    # Measured once: a later load re-applies the process's measurement, unmeasured.
    monkeypatch.setattr(pool_policy, "measure", refuse_to_measure)
    other = EAGER if chosen is CONSERVATIVE else CONSERVATIVE
    pool_policy.apply(other)
    assert pool_policy.choose(kernel_model()) is chosen
    assert ext.parallel_min() == chosen.parallel_min


def refuse_to_measure(model: Any) -> None:
    raise AssertionError("measured where the policy was known")


@kernel_only
@pytest.mark.parametrize("named", [CONSERVATIVE, EAGER], ids=lambda p: p.name)
def test_a_configured_policy_is_applied_unmeasured(
    restored: None, monkeypatch: pytest.MonkeyPatch, named: pool_policy.PoolPolicy
) -> None:
    monkeypatch.setattr(pool_policy, "measure", refuse_to_measure)
    other = EAGER if named is CONSERVATIVE else CONSERVATIVE
    pool_policy.apply(other)
    assert pool_policy.choose(kernel_model(), named.name) is named
    ext = qmm.extension()
    assert (ext.parallel_min(), ext.worker_spin_us()) == (named.parallel_min, named.worker_spin_us)
    assert pool_policy.describe() == {
        "policy": named.name,
        "chosen_by": "engine.kernel_pool",
        "ms_a_step": None,
    }


@kernel_only
def test_auto_after_a_configured_policy_restores_the_measurement(restored: None) -> None:
    measured = pool_policy.choose(kernel_model())
    assert measured is not None
    other = EAGER if measured is CONSERVATIVE else CONSERVATIVE
    pool_policy.choose(kernel_model(), other.name)  # a reload naming the other policy
    assert pool_policy.chosen() is other
    assert pool_policy.choose(kernel_model(), "auto") is measured  # and a reload back
    assert qmm.extension().parallel_min() == measured.parallel_min
    status = pool_policy.describe()
    assert status is not None and status["chosen_by"] == "measured"


@kernel_only
def test_a_model_off_the_kernel_is_not_measured(restored: None) -> None:
    assert pool_policy.choose(tiny_llama()) is None
    assert pool_policy.chosen() is None
    assert pool_policy.describe() is None


@kernel_only
def test_both_policies_decode_the_same_bits(restored: None) -> None:
    model = kernel_model()
    qmm.extension().set_threads(2)
    runs = []
    for policy in (CONSERVATIVE, EAGER):
        pool_policy.apply(policy)
        cache = make_prompt_cache(model)
        logits = model(mx.array([[1, 5, 9, 2, 7]]), cache=cache)
        steps = []
        for _ in range(6):
            token = mx.argmax(logits[:, -1, :], axis=-1)[:, None]
            logits = model(token, cache=cache)
            steps.append(logits)
        mx.eval(steps)
        runs.append(steps)
    for conservative, eager in zip(*runs, strict=True):
        assert mx.array_equal(conservative, eager).item()


def test_check_config_names_a_bad_pool_policy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "vllm-mlx.yaml"
    path.write_text("engine:\n  max_batch_size: 8\n  kernel_pool: fastest\n")
    with pytest.raises(SystemExit) as exited:
        main(["check-config", str(path)])
    assert exited.value.code == 1
    error = capsys.readouterr().err
    expected = "engine.kernel_pool: Input should be 'auto', 'conservative' or 'eager'"
    assert f"{path}:3:3: {expected}" in error
