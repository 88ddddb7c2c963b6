"""Property tests of the decode attention kernel (kernels/attn_kernel.cpp) against MLX:
random shapes, grouped heads, several positions, and masks shaped like a batch cache's
(each row's left padding, some heads excluded further, rows that see no key), float and
quantized K/V. The kernel skips keys before every row's first kept one, so the edges
of that skip (no padding, all padding, one row padded more than another) are drawn."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vllm_mlx.models.cpu import attention, qmm

pytestmark = pytest.mark.skipif(
    not attention.available(), reason=f"kernel unavailable: {qmm.status().detail}"
)
TOL = 3e-5


@st.composite
def problems(draw: st.DrawFn) -> dict[str, object]:
    batch = draw(st.integers(1, 3))
    kv_heads = draw(st.integers(1, 3))
    groups = draw(st.integers(1, 5))
    positions = draw(st.integers(1, 6))
    keys = draw(st.integers(1, 150))
    dim = draw(st.sampled_from([8, 16, 64, 72]))
    pads = [draw(st.integers(0, keys)) for _ in range(batch)]  # keys == pad: sees none
    later_head = draw(st.integers(0, kv_heads * groups - 1))
    later_by = draw(st.integers(0, keys))
    seed = draw(st.integers(0, 2**16))
    kind = draw(st.sampled_from(["bool", "per_head", "additive", "none"]))
    return {
        "b": batch, "hkv": kv_heads, "hq": kv_heads * groups, "m": positions, "t": keys,
        "d": dim, "pads": pads, "head": later_head, "by": later_by, "seed": seed,
        "kind": kind,
    }  # fmt: skip


def _inputs(p: dict[str, object]) -> tuple[mx.array, mx.array, mx.array, mx.array | None]:
    b, hq, hkv, m, t, d = (int(p[k]) for k in ("b", "hq", "hkv", "m", "t", "d"))  # type: ignore[call-overload]
    key = mx.random.key(int(p["seed"]))  # type: ignore[call-overload]
    ks = mx.random.split(key, 3)
    q = mx.random.normal((b, hq, m, d), key=ks[0])
    k = mx.random.normal((b, hkv, t, d), key=ks[1])
    v = mx.random.normal((b, hkv, t, d), key=ks[2])
    position = mx.arange(t).reshape(1, 1, 1, -1)
    starts = mx.array(p["pads"]).reshape(b, 1, 1, 1)
    keep = mx.broadcast_to(position >= starts, (b, 1, m, t))
    kind = p["kind"]
    if kind == "per_head":  # one head of the first row starts later still
        head = mx.arange(hq).reshape(1, hq, 1, 1) == int(p["head"])  # type: ignore[call-overload]
        first_row = mx.arange(b).reshape(b, 1, 1, 1) == 0
        keep = keep & ~(head & first_row & (position < int(p["by"])))  # type: ignore[call-overload]
    if kind == "none":
        return q, k, v, None
    if kind == "additive":
        return q, k, v, mx.where(keep, 0.0, -1e9)
    return q, k, v, keep


def _close(got: mx.array, want: mx.array) -> None:
    assert got.shape == want.shape
    np.testing.assert_allclose(np.array(got), np.array(want), rtol=TOL, atol=TOL)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(problem=problems())
def test_float_kv_matches_mlx(isa: str, problem: dict[str, object]) -> None:
    q, k, v, mask = _inputs(problem)
    got = qmm.extension().sdpa_decode(q, k, v, 0.125, mask)
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask=mask)
    assert bool(mx.isfinite(got).all().item())
    _close(got, want)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(problem=problems(), bits=st.sampled_from([4, 8]))
def test_quantized_kv_matches_mlx_on_the_unpacked_values(
    isa: str, problem: dict[str, object], bits: int
) -> None:
    if int(problem["d"]) % 32:  # type: ignore[call-overload]
        problem = {**problem, "d": 64}  # MLX quantizes in groups of 32 or more
    q, k, v, mask = _inputs(problem)
    kq = mx.quantize(k, group_size=32, bits=bits)
    vq = mx.quantize(v, group_size=32, bits=bits)
    got = qmm.extension().sdpa_decode_quantized(q, tuple(kq), tuple(vq), 0.125, 32, bits, mask)
    unpacked_k = mx.dequantize(*kq, group_size=32, bits=bits)
    unpacked_v = mx.dequantize(*vq, group_size=32, bits=bits)
    want = mx.fast.scaled_dot_product_attention(q, unpacked_k, unpacked_v, scale=0.125, mask=mask)
    _close(got, want)
