"""Volatile system lines (Claude Code's billing header) are removed before templating,
so two sessions share a prefix; user text is never touched; bad patterns are config
errors at their line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.unit.test_config import issues_of, write
from vllm_mlx.api.anthropic import convert
from vllm_mlx.api.anthropic.schema import CountTokensRequest
from vllm_mlx.api.pipeline.canonical import canonical_system
from vllm_mlx.config.sections import DEFAULT_CANONICALIZATION, EngineSettings

# Byte for byte what Claude Code 2.1.197 sends first, from two sessions.
SESSION_A = "x-anthropic-billing-header: cc_version=2.1.197.a3f; cc_entrypoint=sdk-cli;"
SESSION_B = "x-anthropic-billing-header: cc_version=2.1.197.07c; cc_entrypoint=sdk-cli;"
AGENT = "You are Claude Code, Anthropic's official CLI for Claude.\nUse the tools."
DEFAULT = list(DEFAULT_CANONICALIZATION)


def claude_code_system(header: str) -> list[dict[str, Any]]:
    return [{"type": "text", "text": header}, {"type": "text", "text": AGENT}]


def messages_for(system: Any, user: str = "Fix the bug.", volatile: Any = DEFAULT) -> Any:
    body = {"model": "m", "system": system, "messages": [{"role": "user", "content": user}]}
    return convert.build_prompt(CountTokensRequest.model_validate(body), volatile).messages


def test_two_sessions_render_the_same_system_prompt() -> None:
    first = messages_for(claude_code_system(SESSION_A))
    second = messages_for(claude_code_system(SESSION_B))
    assert first == second
    assert first[0] == {"role": "system", "content": AGENT}


def test_without_canonicalization_the_sessions_differ() -> None:
    first = messages_for(claude_code_system(SESSION_A), volatile=[])
    second = messages_for(claude_code_system(SESSION_B), volatile=[])
    assert first != second and SESSION_A in first[0]["content"]


def test_user_content_is_never_changed() -> None:
    rendered = messages_for("Be brief.", user=SESSION_A)
    assert rendered[-1] == {"role": "user", "content": SESSION_A}


def test_only_whole_lines_go() -> None:
    text = f"Intro\n{SESSION_A}\nquoting x-anthropic-billing-header: inside a line"
    kept = canonical_system(text, DEFAULT)
    assert kept == "Intro\nquoting x-anthropic-billing-header: inside a line"
    assert canonical_system(SESSION_A, DEFAULT) == ""
    assert canonical_system("untouched\n\n", DEFAULT) == "untouched\n\n"


def test_patterns_of_ones_own_replace_the_default() -> None:
    assert EngineSettings().prompt_canonicalization == DEFAULT
    patterns = [r"session-id: \w+"]
    assert canonical_system("session-id: abc\nRules", patterns) == "Rules"
    assert canonical_system(SESSION_A, patterns) == SESSION_A


def test_a_bad_pattern_is_an_error_at_its_line(tmp_path: Path) -> None:
    path = write(tmp_path, "engine:\n  prompt_canonicalization:\n    - 'ok.*'\n    - '(open'\n")
    ((line, key, message),) = issues_of(path)
    assert (line, key) == (4, "engine.prompt_canonicalization[1]")
    assert "not a regular expression" in message


def test_openai_responses_and_ollama_system_text_lose_the_line_too() -> None:
    from vllm_mlx.api.ollama import convert as ollama_convert
    from vllm_mlx.api.ollama.schema import ChatRequest
    from vllm_mlx.api.openai import convert as openai_convert
    from vllm_mlx.api.openai.schema import ChatCompletionRequest
    from vllm_mlx.api.responses import convert as responses_convert

    def chat(header: str, role: str = "system") -> Any:
        body = {
            "model": "m",
            "messages": [
                {"role": role, "content": f"{header}\n{AGENT}"},
                {"role": "user", "content": f"{header}\nFix it."},
            ],
        }
        return body

    for role in ("system", "developer"):
        rendered = [
            openai_convert.template_messages(
                ChatCompletionRequest.model_validate(chat(h, role)), DEFAULT
            )
            for h in (SESSION_A, SESSION_B)
        ]
        assert rendered[0][0] == rendered[1][0] == {"role": "system", "content": AGENT}
        assert rendered[0][1]["content"] == f"{SESSION_A}\nFix it."  # the user's text stays
    ollama = ollama_convert.template_messages(ChatRequest.model_validate(chat(SESSION_A)), DEFAULT)
    assert ollama[0]["content"] == AGENT and SESSION_A in ollama[1]["content"]
    items = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]}]
    messages = responses_convert.chat_messages(items, f"{SESSION_B}\n{AGENT}", 0, DEFAULT)
    assert messages[0] == {"role": "system", "content": AGENT}
    kept = responses_convert.chat_messages(items, f"{SESSION_B}\n{AGENT}", 0, [])
    assert kept[0]["content"] == f"{SESSION_B}\n{AGENT}"
