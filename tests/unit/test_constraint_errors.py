"""Where a refused schema, regex or grammar went wrong, from llguidance's own messages."""

from __future__ import annotations

import pytest

from vllm_mlx.engine.constraint_errors import describe_error, locate

SCHEMA = {
    "$defs": {"a": {"type": "string"}},
    "properties": {"when": {"type": "string", "format": "bogus"}, "x": {"$ref": "#/$defs/b"}},
}


@pytest.mark.parametrize(
    ("message", "path"),
    [
        ("Unknown format: bogus", "#/properties/when/format"),
        ("Pointer '/$defs/b' does not exist", "#/properties/x/$ref"),
        ('Unimplemented keys: ["$defs"]', "#/$defs"),
        ("something else entirely", None),
    ],
)
def test_locate_names_the_schema_path(message: str, path: str | None) -> None:
    assert locate(SCHEMA, message) == path


def test_regex_errors_give_the_position() -> None:
    raw = (
        'at 1(8): invalid regex "ab(c": regex parse error:\n'
        "    ab(c\n      ^\nerror: unclosed group\n"
    )
    assert describe_error("regex", "ab(c", raw) == (
        "invalid regex: regex 'ab(c' at position 2: unclosed group"
    )
    schema = {"properties": {"p": {"type": "string", "pattern": "x[a-"}}}
    raw = "regex parse error:\n    x[a-\n     ^\nerror: unclosed character class"
    assert describe_error("json_schema", schema, raw) == (
        "invalid JSON schema at #/properties/p/pattern: regex 'x[a-' at position 1: "
        "unclosed character class"
    )


def test_grammar_errors_give_line_and_column() -> None:
    raw = 'at 1(8): unknown name: "foo"\n   1 | start: foo\n              ^\n'
    assert describe_error("grammar", "start: foo", raw) == (
        'invalid grammar: line 1, column 8: unknown name: "foo"'
    )
