"""Python's cyclic garbage collector kept from pausing every stream for a full pass.

A full (generation 2) collection walks every object the collector tracks, holding the
GIL: the engine thread cannot build the next decode step meanwhile, so every running
stream waits. With the bundled model loaded the daemon tracks ~150k objects (the
tokenizer, mlx-lm's modules, pydantic schemas, Litestar's routes) and a full pass took
15-85 ms of CPU on a 2-core Zen 3 (docs/benchmarks.md, round 12): rare while serving
(one runs once enough objects have survived), but at one stream 85 ms is 4-5 tokens'
time, every stream at once.

What is alive once a model has loaded lives as long as that model. `gc.freeze()` moves
it to a permanent generation that collections skip, so a full pass walks only what
requests made since. Around each load and unload the daemon unfreezes and collects
once (a moment that takes seconds anyway), so an unloaded model's cycles are still
freed, then freezes what remains. Reference counting frees frozen objects as usual:
freezing only takes them out of the cycle search.
"""

from __future__ import annotations

import gc


def settle() -> int:
    """Collect everything once, then freeze the survivors; returns how many are frozen."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
