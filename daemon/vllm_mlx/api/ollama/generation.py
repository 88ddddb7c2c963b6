"""An /api/chat or /api/generate body -> its generation: prompt, request, parser, builder."""

from __future__ import annotations

from dataclasses import dataclass

from vllm_mlx.api.errors import bad_request
from vllm_mlx.api.ollama import convert
from vllm_mlx.api.ollama.builder import Kind, OllamaBuilder
from vllm_mlx.api.ollama.schema import ChatRequest, GenerateRequest
from vllm_mlx.api.pipeline import structured
from vllm_mlx.api.pipeline.chat_template import as_token_list, render_chat
from vllm_mlx.api.pipeline.driver import Run, parsed
from vllm_mlx.api.pipeline.ids import new_id
from vllm_mlx.api.pipeline.turn import Prompt, RequestPlan, Turn
from vllm_mlx.parsers.types import ToolSpec

Body = ChatRequest | GenerateRequest


@dataclass(frozen=True)
class OllamaGeneration:
    run: Run
    builder: OllamaBuilder


def _raw_tokens(tokenizer: object, text: str) -> list[int]:
    return as_token_list(tokenizer.encode(text))  # type: ignore[attr-defined]


async def _prompt(turn: Turn, body: Body) -> tuple[Prompt, list[ToolSpec] | None]:
    kwargs = convert.template_kwargs(turn, body.think)
    if isinstance(body, ChatRequest):
        convert.check_tools(turn, body.tools)
        messages = convert.template_messages(body, turn.settings.engine.prompt_canonicalization)
        tools = convert.template_tools(body.tools)
        prompt = await turn.prompt(render_chat, turn.tokenizer, messages, tools, kwargs)
        return prompt, convert.tool_specs(body.tools)
    if body.suffix:
        raise bad_request("'suffix' (fill-in-the-middle) is not supported by this daemon", "suffix")
    if body.raw:  # the client sends a fully templated prompt
        return await turn.prompt(_raw_tokens, turn.tokenizer, body.prompt), None
    if body.template is not None:
        if not turn.settings.server.allow_client_chat_templates:
            raise bad_request(
                "'template': client-supplied templates are disabled on this server "
                "(server.allow_client_chat_templates)",
                "template",
                "client_templates_disabled",
            )
        kwargs["chat_template"] = body.template  # a Jinja chat template, not Go's
    messages = [{"role": "user", "content": body.prompt}]
    if body.system:
        messages.insert(0, {"role": "system", "content": body.system})
    return await turn.prompt(render_chat, turn.tokenizer, messages, None, kwargs), None


async def ollama_generation(
    turn: Turn, body: Body, kind: Kind, started_ns: int, load_ns: int
) -> OllamaGeneration:
    convert.refuse_images(body.images, "images")
    prompt, tools = await _prompt(turn, body)
    sampling = convert.sampling(turn, body.options)
    max_tokens = turn.allowed_tokens(prompt, convert.max_tokens(turn, body.options))
    constraint = await structured.request_constraint(
        turn, prompt, convert.output_constraint(body.format), None
    )
    plan = RequestPlan(max_tokens, sampling, convert.stop(body.options), constraint=constraint)
    gen = turn.request(new_id(f"ollama-{kind}-"), prompt, plan)
    parser = structured.output_parser(turn, prompt, None, tools)
    builder = OllamaBuilder(
        kind, body.model, streaming=body.stream, started_ns=started_ns, load_ns=load_ns
    )
    return OllamaGeneration(parsed(turn, gen, parser), builder)
