"""Attention for a verify pass computed as decode steps compute it.

A verify pass feeds several positions per row at once. The projections, norms and MLP
give each position the same bits as a one-position step (the CPU kernels are batch
invariant, models/cpu/qmm.py), but multi-position attention takes another path (BLAS
products and a prefill softmax) whose sums run in another order: logits then differ from
decoding in the last bits, and a near tie between two tokens can flip the greedy choice.
So during a verify pass each position's attention is one call of the model's own
one-query attention over exactly the keys decoding would see at that position (the
prefix up to it, with the same mask). Measured on the bundled model: logits identical
bit for bit to decoding, at about the cost of one multi-query call.

Where the model's attention is the CPU extension's (models/cpu/attention.py), its decode
kernel takes all the positions in one call with exactly those bits per row
(`attend_as_decoding`), reading each sequence's K and V once instead of once per
position: what a verify pass at a long context is bound by.

mlx_lm's model modules call `scaled_dot_product_attention` through a module global, so
the split is installed there, only for the duration of the pass and only acting on the
thread that asked (another engine thread running a model of the same architecture
meanwhile goes straight through to the function it had).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import mlx.core as mx

from vllm_mlx.models.cpu import attention as cpu_attention

_NAME = "scaled_dot_product_attention"
Attention = Callable[..., mx.array]

_lock = threading.Lock()
_active = threading.local()
# module -> (the function it had, our wrapper, passes in progress)
_installed: dict[Any, tuple[Attention, Attention, int]] = {}


def _splitting() -> bool:
    return bool(getattr(_active, "on", False))


def _split(inner: Attention) -> Attention:
    def attend(queries: mx.array, keys: mx.array, values: mx.array, *args: Any, **kw: Any) -> Any:
        mask = kw.get("mask")
        rows = queries.shape[2] if queries.ndim == 4 else 1
        if not _splitting() or rows == 1 or args or not isinstance(mask, mx.array):
            return inner(queries, keys, values, *args, **kw)
        if inner is cpu_attention.scaled_dot_product_attention and kw.get("sinks") is None:
            whole = cpu_attention.attend_as_decoding(
                queries, keys, values, kw.get("cache"), kw["scale"], mask
            )
            if whole is not None:
                return whole
        total = _positions(keys)  # the last `rows` keys are this pass's own positions
        outs = []
        for j in range(rows):
            seen = total - rows + j + 1
            step = dict(kw, mask=mask[..., j : j + 1, :seen])
            outs.append(
                inner(queries[:, :, j : j + 1], _upto(keys, seen), _upto(values, seen), **step)
            )
        return mx.concatenate(outs, axis=2)

    return attend


# K or V: an array, or a quantized cache's (words, scales, biases), all by position.
def _positions(stored: Any) -> int:
    first = stored[0] if isinstance(stored, tuple | list) else stored
    return int(first.shape[2])


def _upto(stored: Any, seen: int) -> Any:
    if isinstance(stored, tuple | list):
        return tuple(part[..., :seen, :] for part in stored)
    return stored[..., :seen, :]


def _modules(model: Any) -> list[Any]:
    names = {type(model).__module__}
    names.update(type(m).__module__ for _, m in model.named_modules())
    found = [sys.modules.get(name) for name in sorted(names) if name.startswith("mlx_lm.")]
    return [mod for mod in found if mod is not None and callable(getattr(mod, _NAME, None))]


@contextmanager
def decode_equivalent_attention(model: Any) -> Iterator[None]:
    """Within the block, this thread's multi-position attention calls (a masked pass
    over a batch cache) are computed position by position as decode steps."""
    modules = _modules(model)
    with _lock:
        for mod in modules:
            if mod in _installed:
                inner, wrapper, count = _installed[mod]
                _installed[mod] = (inner, wrapper, count + 1)
            else:
                inner = getattr(mod, _NAME)
                wrapper = _split(inner)
                setattr(mod, _NAME, wrapper)
                _installed[mod] = (inner, wrapper, 1)
    _active.on = True
    try:
        yield
    finally:
        _active.on = False
        with _lock:
            for mod in modules:
                inner, wrapper, count = _installed[mod]
                if count > 1:
                    _installed[mod] = (inner, wrapper, count - 1)
                    continue
                del _installed[mod]
                if getattr(mod, _NAME, None) is wrapper:  # nobody swapped it meanwhile
                    setattr(mod, _NAME, inner)
