"""Tool-call and reasoning parsers: model text in, wire-neutral events out.

Neither parser knows about OpenAI or Anthropic; the API adapters translate the
events defined in ``types``. Start with ``make_output_parser``.
"""

from vllm_mlx.parsers.errors import UnknownParserError
from vllm_mlx.parsers.pipeline import OutputParser, make_output_parser
from vllm_mlx.parsers.reasoning import (
    REASONING_PARSERS,
    ReasoningParser,
    get_reasoning_parser,
    reasoning_parser_names,
)
from vllm_mlx.parsers.tool_calls import (
    TOOL_CALL_PARSERS,
    ToolCallParser,
    get_tool_call_parser,
    tool_call_parser_names,
)
from vllm_mlx.parsers.types import (
    ContentDelta,
    ParsedOutput,
    ParserEvent,
    ReasoningDelta,
    ToolCall,
    ToolCallArgumentsDelta,
    ToolCallStart,
    ToolSpec,
    collect_events,
    new_tool_call_id,
)

__all__ = [
    "REASONING_PARSERS",
    "TOOL_CALL_PARSERS",
    "ContentDelta",
    "OutputParser",
    "ParsedOutput",
    "ParserEvent",
    "ReasoningDelta",
    "ReasoningParser",
    "ToolCall",
    "ToolCallArgumentsDelta",
    "ToolCallParser",
    "ToolCallStart",
    "ToolSpec",
    "UnknownParserError",
    "collect_events",
    "get_reasoning_parser",
    "get_tool_call_parser",
    "make_output_parser",
    "new_tool_call_id",
    "reasoning_parser_names",
    "tool_call_parser_names",
]
