"""Structured outputs for every protocol: the token constraint of a GenerationRequest.

The protocol adapters turn their own fields (OpenAI ``response_format``, vLLM's
``structured_outputs`` / ``guided_*``, Anthropic ``output_format``, forced tool
choices) into a neutral Constraint; this module compiles it off the event loop,
decides where it starts (after the reasoning, for a reasoning model) and binds it.
Forced tool choices also get the parser that reads the constrained calls back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from vllm_mlx.api.errors import APIError, bad_request
from vllm_mlx.api.pipeline.offload import in_worker
from vllm_mlx.api.pipeline.turn import Prompt, Turn
from vllm_mlx.engine.constraints import (
    CompiledConstraint,
    Constraint,
    ConstraintError,
    ReasoningGate,
)
from vllm_mlx.engine.types import TokenConstraint
from vllm_mlx.parsers.forced import (
    CallListParser,
    NamedCallParser,
    arguments_schema,
    call_list_schema,
)
from vllm_mlx.parsers.pipeline import OutputParser, make_output_parser
from vllm_mlx.parsers.reasoning import get_reasoning_parser
from vllm_mlx.parsers.tool_calls.base import ToolCallParser
from vllm_mlx.parsers.types import ToolSpec
from vllm_mlx.telemetry import hooks as tracing


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


def enabled(turn: Turn) -> bool:
    return turn.model is None or turn.model.structured_outputs != "off"


async def request_constraint(
    turn: Turn,
    prompt: Prompt,
    constraint: Constraint | None,
    forced: ForcedTools | None,
) -> TokenConstraint | None:
    """The request's output format, or its forced tool choice, compiled and bound.

    With both (the OpenAI Agents SDK sends `tool_choice: required` with its
    `output_type`, instructor's tools modes the same), this turn must be a call, so the
    calls' grammar applies; the format is still compiled, so a bad one is a 400 now, and
    it constrains the text turn that follows the tool results, where clients no longer
    force a call.
    """
    if forced is not None:
        if constraint is not None:
            await bound(turn, prompt, constraint)  # checked: its errors name the format
        return await calls_constraint(turn, prompt, forced)
    if constraint is not None:
        return await bound(turn, prompt, constraint)
    return None


def output_parser(
    turn: Turn,
    prompt: Prompt,
    forced: ForcedTools | None,
    tools: Sequence[ToolSpec] | None,
) -> OutputParser | None:
    """The forced calls' reader, or the model's own parsers (`tools` None: none offered,
    so calls stay plain text).

    Tool calls are parsed only when the model enables auto tool choice (like vLLM);
    otherwise a model's calls come back as plain content.
    """
    if forced is not None:
        return forced_output_parser(turn, prompt, forced)
    model = turn.model
    if model is None:
        return None
    tool_parser = (
        model.tool_call_parser if model.enable_auto_tool_choice and tools is not None else None
    )
    if tool_parser is None and model.reasoning_parser is None:
        return None
    return make_output_parser(tool_parser, model.reasoning_parser, tools, prompt.opens_reasoning)


async def calls_constraint(turn: Turn, prompt: Prompt, forced: ForcedTools) -> TokenConstraint:
    """The output constrained to the forced calls; the last constraint is the output's."""
    *tools, whole = forced.constraints()
    for constraint in tools:
        await bound(turn, prompt, constraint)  # checked alone: errors name the tool
    return await bound(turn, prompt, whole)


async def bound(turn: Turn, prompt: Prompt, constraint: Constraint) -> TokenConstraint:
    """Compile ``constraint`` (worker thread, cached) and bind it to this prompt.

    A bad schema, regex or grammar is a 400 naming the request field and the place
    in it; a model with ``structured_outputs: off`` refuses with a 400 too.
    """
    if not enabled(turn):
        raise bad_request(
            f"structured outputs are turned off for model '{turn.model_id}' "
            "(structured_outputs: off)",
            constraint.param,
            "structured_outputs_disabled",
        )
    compiler = turn.engine.constraints
    if turn.metrics is not None and compiler.observe is None:
        compiler.observe = turn.metrics.mask_observer(turn.name)
    try:
        compiled = await _compile(turn, constraint)
    except ConstraintError as exc:
        code = "invalid_json_schema" if constraint.kind == "json_schema" else "invalid_constraint"
        # The field goes in the message too: Anthropic's error shape has no param.
        message = f"{exc.param}: {exc}" if exc.param else str(exc)
        raise APIError(400, message, "invalid_request", exc.param, code) from exc
    return compiled.bind(reasoning_gate(turn, prompt))


async def _compile(turn: Turn, constraint: Constraint) -> CompiledConstraint:
    """Compile in the request worker pool (never on the event loop), bounded in time.

    Running past compile_timeout is the constraint's fault, so it is a ConstraintError
    (a 400 naming the field), not the prompt's 413.
    """
    compiler = turn.engine.constraints
    attributes = {"vllm_mlx.constraint.kind": constraint.kind}
    try:
        with tracing.span("structured_output.compile", attributes):
            async with asyncio.timeout(compiler.compile_timeout):
                compiled: CompiledConstraint = await in_worker(compiler.compile, constraint)
        return compiled
    except TimeoutError:
        message = f"compiling the constraint took longer than {compiler.compile_timeout:g} s"
        raise ConstraintError(message, constraint.param) from None


def reasoning_gate(turn: Turn, prompt: Prompt) -> ReasoningGate | None:
    """For a reasoning model the thinking stays free; the answer after it is constrained."""
    model = turn.model
    if model is None or model.reasoning_parser is None:
        return None
    parser = get_reasoning_parser(model.reasoning_parser)
    tokenizer = turn.tokenizer
    close = tuple(tokenizer.encode(parser.close_tag, add_special_tokens=False))
    opener = tokenizer.encode(parser.open_tag, add_special_tokens=False)
    return ReasoningGate(
        close_tokens=close,
        inside=prompt.opens_reasoning,
        open_token=opener[0] if len(opener) == 1 else None,
    )


def forced_output_parser(turn: Turn, prompt: Prompt, forced: ForcedTools) -> OutputParser:
    """The model's reasoning parser (if any) in front of the forced calls' reader."""
    model = turn.model
    reasoning = None
    if model is not None and model.reasoning_parser is not None:
        cls = get_reasoning_parser(model.reasoning_parser)
        reasoning = cls(starts_in_reasoning=prompt.opens_reasoning)
    return OutputParser(reasoning, forced.parser())
