"""A FAKE for tests: the real daemon, with some models' outputs forced to a recorded reply.

`python -m tests.support.replay_daemon --replay NAME=FILE.json ... serve --config ...`
runs `vllm_mlx.cli.main.main()` after making each model NAME answer every request with
the `text` of FILE.json ({"base": <source>, "text": <output>}), then its end token.
tests/conftest.py starts daemons this way for the `replay:FILE.json` model sources a
test config names (tests/support/replay.py turns those into the base source).

Why a fake: the tests must check tool calls and reasoning end to end, but a model that
writes them (Qwen3, Hermes) is far too big to run here, and the bundled SmolLM2-135M
never writes them. So the bundled model serves the request for real and only the
choice of each next token is taken from the recording; the tokenizer, scheduler,
continuous batching, sampler, detokenizer, parsers and protocol adapters all run as in
production. The daemon itself knows nothing of this: the production code has no
replay notion, and this module adds it from outside.

How: a per-request logits processor that puts all the mass on the script's next token
(the real greedy or seeded sampler then picks it). The scheduler builds each request's
processors in `Scheduler._processors`; this module wraps that method on the schedulers
of the replayed models only (found by name when their Engine is built, so reloads are
covered; `Engine.__init__` is wrapped as soon as the daemon imports it). A processor is
per request, so it simply counts its own steps. Wrapping the
model instead (logits forced in `nn.Module.__call__`) was rejected: the model sees
batch rows, not requests, and a row's place in its script cannot be told reliably from
the KV cache (prefix-cache hits, left padding and rows joining or leaving the batch).
Structured outputs are off for these models (their output cannot follow a grammar): the
config the tests write sets `structured_outputs: off` on them.
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.util
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

# Nothing here imports mlx at module level: the daemon must pick MLX's BLAS before mlx
# is first imported (vllm_mlx.models.cpu.blas), so the engine is patched only once the
# daemon itself imports it (`after_import`).
if TYPE_CHECKING:
    from vllm_mlx.engine.engine import Engine
    from vllm_mlx.engine.sampling import Fault, LogitsProcessor
    from vllm_mlx.engine.scheduler import Scheduler
    from vllm_mlx.engine.types import GenerationRequest

ENGINE_MODULE = "vllm_mlx.engine.engine"


def forcing_processor(script: Sequence[int], end_token: int) -> LogitsProcessor:
    """Force one request's output to `script`, then `end_token` (only the logits
    change: the model still runs every step)."""
    import mlx.core as mx

    tokens = list(script)
    position = 0  # one call per sampled token of this request

    def force(history: mx.array, logits: mx.array) -> mx.array:
        nonlocal position
        target = tokens[position] if position < len(tokens) else end_token
        position += 1
        mask = mx.arange(logits.shape[-1]) == target
        return mx.where(mask, 0.0, -1e9).astype(logits.dtype)[None]

    return force


def force_output(scheduler: Scheduler, script: Sequence[int], end_token: int) -> None:
    """Every request this scheduler takes from now on outputs `script`, then ends."""
    from vllm_mlx.engine.logprobs import RawCapture
    from vllm_mlx.engine.sampling import guard_processor

    own: Callable[[GenerationRequest, Fault], list[LogitsProcessor]] = scheduler.slot_processors

    def processors(request: GenerationRequest, fault: Fault) -> list[LogitsProcessor]:
        chosen = own(request, fault)
        # Last, after any constraint, and guarded like the scheduler's own processors.
        chosen.append(guard_processor(forcing_processor(script, end_token), fault))
        raw = request.logprobs is not None and request.logprobs_raw
        if raw and not any(isinstance(p, RawCapture) for p in chosen):
            chosen.insert(0, RawCapture())  # the scheduler adds it only to a non-empty list
        return chosen

    scheduler.slot_processors = processors


def after_import(name: str, patch: Callable[[ModuleType], None]) -> None:
    """Run `patch` on module `name` right after it is first imported (by the daemon)."""

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
            if fullname != name:
                return None
            sys.meta_path.remove(self)  # once; and the lookup below must not find us
            spec = importlib.util.find_spec(fullname)
            assert spec is not None and spec.loader is not None, fullname
            execute = spec.loader.exec_module

            def exec_module(module: ModuleType) -> None:
                execute(module)
                patch(module)

            spec.loader.exec_module = exec_module  # type: ignore[method-assign]
            return spec

    assert name not in sys.modules, f"{name} is imported already: too late to patch it"
    sys.meta_path.insert(0, Finder())


def patch_engine(engine_class: type[Engine], texts: dict[str, str]) -> None:
    """Engines of the models named in `texts` answer every request with their text
    (all other models are untouched)."""
    build = engine_class.__init__

    def init(self: Engine, loaded: Any, *args: Any, **kwargs: Any) -> None:
        build(self, loaded, *args, **kwargs)
        text = texts.get(loaded.name)
        if text is not None:
            script = loaded.tokenizer.encode(text, add_special_tokens=False)
            force_output(self.scheduler, script, min(self.eos_token_ids))

    engine_class.__init__ = init  # type: ignore[method-assign]


def install(texts: dict[str, str]) -> None:
    after_import(ENGINE_MODULE, lambda module: patch_engine(module.Engine, texts))


def read_text(script: Path) -> str:
    return str(json.loads(script.read_text())["text"])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--replay",
        action="append",
        default=[],
        metavar="NAME=FILE",
        help="model NAME answers with FILE's recorded text (repeatable)",
    )
    parser.add_argument("daemon_args", nargs=argparse.REMAINDER, help="vllm-mlx's arguments")
    args = parser.parse_args(argv)
    texts = {}
    for pair in args.replay:
        name, sep, file = pair.partition("=")
        if not sep:
            parser.error(f"--replay takes NAME=FILE, not {pair!r}")
        texts[name] = read_text(Path(file))
    install(texts)
    from vllm_mlx.cli.main import main as daemon_main

    return daemon_main(args.daemon_args)


if __name__ == "__main__":
    raise SystemExit(main())
