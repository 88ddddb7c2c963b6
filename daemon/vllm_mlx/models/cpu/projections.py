"""Sibling projections of one input in one kernel call: q/k/v, and an MLP's gate/up.

A decode step of the bundled model makes ~210 quantized matmuls, most of them small
(576 x 576 at one row is ~0.3 M multiply-adds): each call is a graph node, an MLX task
and a hand-off to the kernel's threads, which at one stream cost about as much as the
arithmetic. mlx_lm's attention calls `q_proj(x), k_proj(x), v_proj(x)` and its SwiGLU
MLP `gate_proj(x), up_proj(x)` on the same x; the extension's `quantized_matmul_many`
computes such a set in one node and one thread split, each output with the same bits
as its own call (kernels/qmm_kernel.cpp `qmm_many`), so outputs do not change.

The layers stay as they are (same modules, names, weights, adapters): whichever member
of a group is called first computes every member's product and leaves the others theirs,
keyed by the input object; a member called with that same input takes it. A member
called with another input (cross-attention feeds k and v from elsewhere) turns its
group off for good: each layer then computes its own, as before. Rows beyond the
kernel's `max_rows` (prefill through BLAS) take the per-layer path inside the call.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx

from vllm_mlx.models.cpu import qmm

# Attribute names of projections that mlx_lm's modules call on one input, in call order.
SIBLINGS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


class ProjectionGroup:
    """Layers that take one input; `output` gives a member its product of x."""

    def __init__(self, members: list[Any]) -> None:
        self.members = members
        self.active = True
        # Products computed for members not yet called: id(member) -> (x, y).
        self._waiting: dict[int, tuple[mx.array, mx.array]] = {}

    def output(self, member: Any, x: mx.array) -> mx.array:
        if not self.active:
            return qmm._matmul(member, x)
        waiting = self._waiting.pop(id(member), None)
        if waiting is not None:
            if waiting[0] is x:
                return waiting[1]
            # Fed another input than its siblings: this group's layers do not share x.
            self.active = False
            self._waiting.clear()
            return qmm._matmul(member, x)
        first = self.members[0]
        products = qmm.extension().quantized_matmul_many(
            x,
            [m["weight"] for m in self.members],
            [m["scales"] for m in self.members],
            [m["biases"] for m in self.members],
            first.group_size,
            first.bits,
            qmm.max_rows(),
            int8=first.int8_activations,
        )
        own = products[0]
        for sibling, product in zip(self.members, products, strict=True):
            if sibling is member:
                own = product
            else:
                self._waiting[id(sibling)] = (x, product)
        return own  # type: ignore[no-any-return]


def _compatible(members: list[Any]) -> bool:
    if not all(type(m) is qmm.KernelQuantizedLinear for m in members):
        return False
    first = members[0]
    return all(
        m.group_size == first.group_size
        and m.bits == first.bits
        and m.int8_activations == first.int8_activations
        and m["weight"].shape[1] == first["weight"].shape[1]
        and m["scales"].dtype == first["scales"].dtype
        for m in members
    )


def group_projections(model: Any) -> int:
    """Group every set of kernel layers named in SIBLINGS under one parent; returns how
    many groups were made."""
    groups = 0
    for _, module in model.named_modules():
        for names in SIBLINGS:
            members = [getattr(module, name, None) for name in names]
            if None in members or not _compatible(members):
                continue
            group = ProjectionGroup(members)
            for member in members:
                # object.__setattr__: a plain attribute, outside the module's parameters.
                object.__setattr__(member, "projection_group", group)
            groups += 1
    return groups


def grouped(model: Any) -> int:
    """How many layers of `model` belong to an active group (tests, `models` output)."""
    return sum(
        1
        for _, m in model.named_modules()
        if getattr(getattr(m, "projection_group", None), "active", False)
    )
