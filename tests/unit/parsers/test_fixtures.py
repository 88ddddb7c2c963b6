"""Every parser against its recorded outputs, whole and split at arbitrary points."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vllm_mlx.parsers import tool_call_parser_names

from .fixtures import CASES, FIXTURES, Case, split, stream_summary, summary

FAST = settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
ids = [case.id for case in CASES]


def test_every_parser_has_a_fixture_file_with_the_required_kinds_of_output() -> None:
    names = {path.stem for path in FIXTURES.glob("*.json")}
    assert names == set(tool_call_parser_names())
    for name in names:
        cases = [case for case in CASES if case.parser == name]
        calls = [len(case.expected["tool_calls"]) for case in cases]
        assert any(not c.expected["tool_calls"] and c.expected["content"] for c in cases)
        assert 1 in calls, f"{name}: no single call"
        assert any(n > 1 for n in calls), f"{name}: no parallel calls"
        assert any("unicode" in case.name for case in cases) or name == "auto"
        assert any(case.name == "unknown_tool" for case in cases)


@pytest.mark.parametrize("case", CASES, ids=ids)
def test_parse_matches_the_recorded_expectation(case: Case) -> None:
    assert summary(case.output_parser().parse(case.text)) == case.expected


@pytest.mark.parametrize("case", CASES, ids=ids)
def test_parsed_calls_have_ids_and_compact_json_arguments(case: Case) -> None:
    for call in case.output_parser().parse(case.text).tool_calls:
        assert call.id
        if case.parser not in {"mistral", "kimi", "auto"}:
            assert re.fullmatch(r"call_[0-9a-f]{24}", call.id)
        arguments = json.loads(call.arguments)
        assert isinstance(arguments, dict)
        assert call.arguments == json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))


@pytest.mark.parametrize("case", CASES, ids=ids)
def test_streaming_one_character_at_a_time_matches_parse(case: Case) -> None:
    expected = summary(case.output_parser().parse(case.text))
    assert stream_summary(case.output_parser(), list(case.text)) == expected


@pytest.mark.parametrize("case", CASES, ids=ids)
@FAST
@given(data=st.data())
def test_streaming_split_anywhere_matches_parse(case: Case, data: st.DataObject) -> None:
    cuts = data.draw(st.lists(st.integers(0, len(case.text)), max_size=12), label="cuts")
    expected = summary(case.output_parser().parse(case.text))
    assert stream_summary(case.output_parser(), split(case.text, cuts)) == expected
