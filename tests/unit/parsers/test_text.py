"""The scanning helpers every streaming parser relies on."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_mlx.parsers._text import MALFORMED, BracketScanner, WhitespaceTrim, balanced_end

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet="ab{}[]()\"\\' \n"),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=8,
)


def test_balanced_end_skips_brackets_in_strings() -> None:
    text = '{"a": "} ] \\" {", "b": [1, {"c": ")"}]} tail'
    assert balanced_end(text, 0) == text.index(" tail")
    assert balanced_end(text[:-6], 0) is None
    assert balanced_end("{]", 0) == MALFORMED
    assert balanced_end("x{}", 0) == MALFORMED
    assert balanced_end("[f(a='])')]", 0, quotes="\"'") == len("[f(a='])')]")


@settings(max_examples=60, deadline=None)
@given(value=json_values.filter(lambda v: isinstance(v, (list, dict))), tail=st.text(max_size=5))
def test_resumed_scan_agrees_with_a_fresh_scan_on_every_prefix(value: object, tail: str) -> None:
    text = json.dumps(value) + tail
    scanner = BracketScanner()
    for size in range(len(text) + 1):
        assert scanner.end(text[:size], 0) == balanced_end(text[:size], 0)
    assert balanced_end(text, 0) == len(json.dumps(value))


def test_scanner_restarts_when_the_text_is_not_an_extension() -> None:
    scanner = BracketScanner()
    assert scanner.end('{"a": "', 0) is None
    assert scanner.end("{}", 0) == 2


def test_whitespace_trim_drops_the_edges_and_collapses_around_boundaries() -> None:
    trim = WhitespaceTrim()
    out = [trim.push("\n  Hello"), trim.push(" world \n"), trim.push("")]
    trim.boundary()
    out += [trim.push("\n\n"), trim.push("  again.\n")]
    assert "".join(out) == "Hello world \nagain."
