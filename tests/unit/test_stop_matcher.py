"""Stop strings across chunk boundaries: held back while they might still match."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from vllm_mlx.engine.output import StopMatcher


def feed_all(stops: list[str], chunks: list[str]) -> tuple[str, str | None]:
    matcher = StopMatcher(stops)
    out = ""
    for chunk in chunks:
        text, hit = matcher.feed(chunk)
        out += text
        if hit is not None:
            return out, hit
    return out + matcher.flush(), None


def test_stop_split_across_chunks_is_found_and_not_emitted() -> None:
    assert feed_all(["END"], ["abc E", "N", "D tail"]) == ("abc ", "END")


def test_partial_prefix_is_held_then_released() -> None:
    matcher = StopMatcher(["STOP"])
    assert matcher.feed("go ST") == ("go ", None)
    assert matcher.feed("ART") == ("START", None)


def test_earliest_of_several_stops_wins() -> None:
    assert feed_all(["world", "lo"], ["hello world"]) == ("hel", "lo")


def test_no_stops_passes_text_through() -> None:
    assert feed_all([], ["a", "b"]) == ("ab", None)


@given(
    text=st.text(alphabet="abcXY", max_size=40),
    stop=st.text(alphabet="abcXY", min_size=1, max_size=4),
    cuts=st.lists(st.integers(min_value=0, max_value=40), max_size=6),
)
def test_any_split_gives_the_same_result_as_one_chunk(
    text: str, stop: str, cuts: list[int]
) -> None:
    points = sorted({min(c, len(text)) for c in cuts})
    chunks = [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]
    expected = (text[: text.index(stop)], stop) if stop in text else (text, None)
    assert feed_all([stop], chunks) == expected
