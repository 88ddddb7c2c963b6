"""Responses tools -> the chat template's tools and the parser's tool specs.

Function tools are offered as they are; Codex's `namespace` tools group functions,
which the model sees as `namespace.name` and which come back as function_call items
with `namespace` and `name`. Hosted tools a local server cannot run (web_search,
file_search, code_interpreter, image_generation, ...) are left out of the prompt with
one warning line per request, never an error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import structlog

from vllm_mlx.api.errors import bad_request
from vllm_mlx.api.pipeline.structured import ForcedTools
from vllm_mlx.api.responses.convert import flat_name, validated
from vllm_mlx.api.responses.schema import CreateResponseRequest, FunctionTool, NamespaceTool
from vllm_mlx.parsers.types import ToolSpec

log = structlog.get_logger("vllm_mlx.responses")


@dataclass
class ToolSet:
    template: list[dict[str, Any]]  # what the chat template renders
    specs: list[ToolSpec]
    namespaces: dict[str, tuple[str, str]]  # flat name -> (namespace, name)
    left_out: list[str]  # tool types a local server cannot run
    params: dict[str, str] = field(default_factory=dict)  # flat name -> its schema's path


def tool_set(body: CreateResponseRequest) -> ToolSet:
    tools = ToolSet([], [], {}, [])
    for index, raw in enumerate(body.tools or []):
        where = f"tools[{index}]"
        kind = raw.get("type")
        if kind == "function":
            _add_function(tools, validated(FunctionTool, raw, where), None, where)
        elif kind == "namespace":
            namespace = validated(NamespaceTool, raw, where)
            for position, inner in enumerate(namespace.tools):
                if inner.get("type") != "function":
                    tools.left_out.append(f"{namespace.name}.{inner.get('type')}")
                    continue
                inner_where = f"{where}.tools[{position}]"
                function = validated(FunctionTool, inner, inner_where)
                _add_function(tools, function, namespace.name, inner_where)
        else:
            tools.left_out.append(str(kind))
    return tools


def _add_function(
    tools: ToolSet, function: FunctionTool, namespace: str | None, where: str
) -> None:
    name = flat_name(namespace, function.name)
    tools.params[name] = f"{where}.parameters"
    spec: dict[str, Any] = {"name": name, "parameters": function.parameters or {}}
    if function.description:
        spec["description"] = function.description
    tools.template.append({"type": "function", "function": spec})
    tools.specs.append(ToolSpec(name, function.parameters))
    if namespace is not None:
        tools.namespaces[name] = (namespace, function.name)


def offered(tools: ToolSet, choice: str | dict[str, Any] | None) -> ToolSet:
    """The tools the model is shown after tool_choice: none, all, or the named ones."""
    if choice is None or choice in ("auto", "required"):
        return tools
    if choice == "none":
        return ToolSet([], [], tools.namespaces, tools.left_out, tools.params)
    if isinstance(choice, str):
        raise bad_request(
            f"tool_choice must be none, auto, required or an object, not {choice!r}",
            "tool_choice",
        )
    names = _chosen_names(choice, tools)
    keep = [index for index, spec in enumerate(tools.specs) if spec.name in names]
    return ToolSet(
        [tools.template[i] for i in keep],
        [tools.specs[i] for i in keep],
        tools.namespaces,
        tools.left_out,
        tools.params,
    )


def _chosen_names(choice: dict[str, Any], tools: ToolSet) -> set[str]:
    kind = choice.get("type")
    known = {spec.name for spec in tools.specs}
    if kind == "function":
        name = choice.get("name")
        if not isinstance(name, str) or name not in known:
            raise bad_request(
                f"tool_choice names the function {name!r}, which is not in 'tools'",
                "tool_choice.name",
            )
        return {name}
    if kind == "allowed_tools":
        listed = choice.get("tools")
        if not isinstance(listed, list) or not all(isinstance(t, dict) for t in listed):
            raise bad_request("tool_choice.tools must be a list of tools", "tool_choice.tools")
        names = {t.get("name") for t in listed if t.get("type") == "function"}
        return {name for name in names if isinstance(name, str) and name in known}
    raise bad_request(
        f"tool_choice type {kind!r} names a tool this server cannot run; use none, auto, "
        "required, a function or allowed_tools",
        "tool_choice.type",
    )


def warn_left_out(tools: ToolSet, request_id: str) -> None:
    """One warning line per request: hosted tools are dropped, never an error."""
    if tools.left_out:
        log.warning(
            "tools left out of the prompt: this server cannot run them",
            request_id=request_id,
            tool_types=sorted(set(tools.left_out)),
        )


def forced(body: CreateResponseRequest, tools: ToolSet, offered_set: ToolSet) -> ForcedTools | None:
    """tool_choice "required", a named function, or allowed_tools in required mode:
    the output must be calls to the offered tools (constrained decoding)."""
    choice = body.tool_choice
    kind = choice.get("type") if isinstance(choice, dict) else choice
    named = kind == "function"
    required = kind == "required" or (
        kind == "allowed_tools" and isinstance(choice, dict) and choice.get("mode") == "required"
    )
    if not (named or required):
        return None
    if not offered_set.specs:
        raise bad_request(f"tool_choice '{kind}' needs at least one function tool", "tool_choice")
    params = [tools.params[spec.name] for spec in offered_set.specs]
    single = body.parallel_tool_calls is False
    return ForcedTools(offered_set.specs, params, named=named, single=single)
