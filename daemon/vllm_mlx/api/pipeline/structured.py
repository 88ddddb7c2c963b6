"""Structured outputs for every protocol: a Constraint onto a GenerationRequest.

The protocol adapters turn their own fields (OpenAI ``response_format``, vLLM's
``structured_outputs`` / ``guided_*``, Anthropic ``output_format``, forced tool
choices) into a neutral Constraint; this module compiles it off the event loop,
decides where it starts (after the reasoning, for a reasoning model) and attaches it.
Forced tool choices also get the parser that reads the constrained calls back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from vllm_mlx.api.errors import APIError, bad_request
from vllm_mlx.api.pipeline.offload import off_loop
from vllm_mlx.api.pipeline.turn import Target, model_settings_of, output_parser_for
from vllm_mlx.engine.constraints import (
    CompiledConstraint,
    Constraint,
    ConstraintError,
    ReasoningGate,
)
from vllm_mlx.engine.types import GenerationRequest
from vllm_mlx.parsers.forced import (
    CallListParser,
    NamedCallParser,
    arguments_schema,
    call_list_schema,
)
from vllm_mlx.parsers.pipeline import OutputParser
from vllm_mlx.parsers.reasoning import get_reasoning_parser
from vllm_mlx.parsers.tool_calls.base import ToolCallParser
from vllm_mlx.parsers.types import ToolSpec


@dataclass(frozen=True)
class ForcedTools:
    """A tool choice that must produce calls: one named tool, or any of ``tools``."""

    tools: Sequence[ToolSpec]
    params: Sequence[str]  # where each tool's schema is in the request, for errors
    named: bool = False
    single: bool = False  # parallel tool calls off: exactly one call

    def constraints(self) -> list[Constraint]:
        """Each tool's own schema (so errors name it), then the whole output's."""
        own = [
            Constraint("json_schema", arguments_schema(tool), param)
            for tool, param in zip(self.tools, self.params, strict=True)
        ]
        if self.named:
            return own
        whole = call_list_schema(self.tools, self.single)
        return [*own, Constraint("json_schema", whole, "tool_choice")]

    def parser(self) -> ToolCallParser:
        return NamedCallParser(self.tools) if self.named else CallListParser(self.tools)


def enabled(target: Target) -> bool:
    model = model_settings_of(target)
    return model is None or model.structured_outputs != "off"


async def attach(
    target: Target,
    gen: GenerationRequest,
    constraint: Constraint | None,
    forced: ForcedTools | None,
    format_field: str,
) -> None:
    """Attach the request's output format, or its forced tool choice: never both, as
    the calls' grammar and the format's would contradict each other."""
    if forced is not None:
        if constraint is not None:
            raise bad_request(
                f"a forced tool_choice cannot be combined with {format_field}", constraint.param
            )
        await constrain_calls(target, gen, forced)
    elif constraint is not None:
        await constrain(target, gen, constraint)


def output_parser(
    target: Target,
    gen: GenerationRequest,
    forced: ForcedTools | None,
    tools: Sequence[ToolSpec] | None,
) -> OutputParser | None:
    """The forced calls' reader, or the model's own parsers (`tools` None: none offered,
    so calls stay plain text)."""
    if forced is not None:
        return forced_output_parser(target, gen, forced)
    return output_parser_for(target, gen, tools)


async def constrain_calls(target: Target, gen: GenerationRequest, forced: ForcedTools) -> None:
    """Constrain the output to the forced calls; the last constraint is the output's."""
    *tools, whole = forced.constraints()
    for constraint in tools:
        await constrain(target, gen, constraint)  # checked alone: errors name the tool
    await constrain(target, gen, whole)


async def constrain(target: Target, gen: GenerationRequest, constraint: Constraint) -> None:
    """Compile ``constraint`` (worker thread, cached) and attach it to ``gen``.

    A bad schema, regex or grammar is a 400 naming the request field and the place
    in it; a model with ``structured_outputs: off`` refuses with a 400 too.
    """
    if not enabled(target):
        raise bad_request(
            f"structured outputs are turned off for model '{target.model_id}' "
            "(structured_outputs: off)",
            constraint.param,
            "structured_outputs_disabled",
        )
    compiler = target.engine.constraints
    if target.metrics is not None and compiler.observe is None:
        compiler.observe = target.metrics.mask_observer(target.name or target.model_id)
    try:
        compiled = await _compile(target, constraint)
    except ConstraintError as exc:
        code = "invalid_json_schema" if constraint.kind == "json_schema" else "invalid_constraint"
        # The field goes in the message too: Anthropic's error shape has no param.
        message = f"{exc.param}: {exc}" if exc.param else str(exc)
        raise APIError(400, message, "invalid_request", exc.param, code) from exc
    gen.constraint = compiled.bind(reasoning_gate(target, gen))


async def _compile(target: Target, constraint: Constraint) -> CompiledConstraint:
    """Compile in the request worker pool (never on the event loop), bounded in time."""
    compiler = target.engine.constraints
    try:
        return await off_loop(compiler.compile, constraint, limit_s=compiler.compile_timeout)
    except APIError as exc:
        if exc.status != 413:
            raise
        message = f"compiling the constraint took longer than {compiler.compile_timeout:g} s"
        raise ConstraintError(message, constraint.param) from None


def reasoning_gate(target: Target, gen: GenerationRequest) -> ReasoningGate | None:
    """For a reasoning model the thinking stays free; the answer after it is constrained."""
    model = model_settings_of(target)
    if model is None or model.reasoning_parser is None:
        return None
    parser = get_reasoning_parser(model.reasoning_parser)
    tokenizer = target.engine.tokenizer
    close = tuple(tokenizer.encode(parser.close_tag, add_special_tokens=False))
    opener = tokenizer.encode(parser.open_tag, add_special_tokens=False)
    tail = tokenizer.decode(gen.prompt_tokens[-16:])
    return ReasoningGate(
        close_tokens=close,
        inside=parser.prompt_opens_reasoning(tail),
        open_token=opener[0] if len(opener) == 1 else None,
    )


def forced_output_parser(
    target: Target, gen: GenerationRequest, forced: ForcedTools
) -> OutputParser:
    """The model's reasoning parser (if any) in front of the forced calls' reader."""
    model = model_settings_of(target)
    reasoning = None
    if model is not None and model.reasoning_parser is not None:
        cls = get_reasoning_parser(model.reasoning_parser)
        tail = target.engine.tokenizer.decode(gen.prompt_tokens[-16:])
        reasoning = cls(starts_in_reasoning=cls.prompt_opens_reasoning(tail))
    return OutputParser(reasoning, forced.parser())
