"""Pure pieces of `n` and logprobs: merging choice streams, derived seeds, legacy shape."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from vllm_mlx.api.openai.choices import seed_for
from vllm_mlx.api.openai.logprobs import LegacyLogprobs, TokenTexts, merge_blocks
from vllm_mlx.api.pipeline.driver import merge
from vllm_mlx.engine.types import TokenLogprob


def test_seeds_are_derived_distinct_and_in_range() -> None:
    assert seed_for(None, 3) is None
    assert seed_for(42, 0) == 42
    seeds = [seed_for(s, i) for s in (-(2**63), -1, 0, 2**63 - 1) for i in range(8)]
    assert all(s is not None and -(2**63) <= s < 2**63 for s in seeds)
    assert len({seed_for(7, i) for i in range(128)}) == 128


async def numbers(
    values: list[int], closed: list[int], fail_at: int | None = None
) -> AsyncIterator[int]:
    try:
        for value in values:
            await asyncio.sleep(0)
            if value == fail_at:
                raise ValueError("boom")
            yield value
    finally:
        closed.append(values[0])


def test_merge_interleaves_and_keeps_each_stream_in_order() -> None:
    async def main() -> list[tuple[int, int]]:
        closed: list[int] = []
        streams = [numbers([1, 2, 3], closed), numbers([10, 20], closed)]
        return [item async for item in merge(streams)]

    items = asyncio.run(main())
    assert [v for i, v in items if i == 0] == [1, 2, 3]
    assert [v for i, v in items if i == 1] == [10, 20]


def test_merge_raises_the_first_failure_and_closes_the_others() -> None:
    closed: list[int] = []

    async def main() -> None:
        streams = [numbers([1, 2, 3, 4, 5, 6], closed), numbers([10, 20], closed, fail_at=20)]
        async for _ in merge(streams):
            pass

    with pytest.raises(ValueError, match="boom"):
        asyncio.run(main())
    assert sorted(closed) == [1, 10]


def test_leaving_a_merge_early_closes_every_stream() -> None:
    closed: list[int] = []

    async def main() -> None:
        merged = merge([numbers([1, 2, 3], closed), numbers([10, 20, 30], closed)])
        async for _ in merged:
            break
        await merged.aclose()

    asyncio.run(main())
    assert sorted(closed) == [1, 10]


class ByteLevelVocab:
    """The three methods TokenTexts reads, over a tiny GPT-2 byte-level vocabulary."""

    all_special_ids = (0,)

    def __init__(self) -> None:
        self.pieces = {
            0: "<|endoftext|>",
            1: "Hello",
            2: "Ġw\u00c3\u00b6rld",
            3: "\u00c3",
            4: "<0x0A>",
        }

    def get_vocab(self) -> dict[str, int]:
        return {p: i for i, p in self.pieces.items()}

    def convert_ids_to_tokens(self, token: int) -> str:
        return self.pieces[token]


def test_token_bytes_are_exact_even_for_part_of_a_character() -> None:
    texts = TokenTexts(ByteLevelVocab())
    assert texts.get(1) == ("Hello", b"Hello")
    assert texts.get(2) == (" wörld", " wörld".encode())
    assert texts.get(3) == ("\ufffd", b"\xc3")  # the first byte of a two-byte character
    assert texts.get(4) == ("\n", b"\n")  # SentencePiece byte fallback
    assert texts.get(0) == ("<|endoftext|>", b"<|endoftext|>")


def test_legacy_blocks_offsets_and_prompt_nulls() -> None:
    legacy = LegacyLogprobs(TokenTexts(ByteLevelVocab()))
    prompt = legacy.block([None, TokenLogprob(2, -1.5, ((1, -0.5),))], prompt=[1, 2])
    generated = legacy.block([TokenLogprob(1, -0.25, ())])
    merged = merge_blocks([prompt, generated])
    assert merged["tokens"] == ["Hello", " wörld", "Hello"]
    assert merged["token_logprobs"] == [None, -1.5, -0.25]
    assert merged["top_logprobs"] == [None, {"Hello": -0.5, " wörld": -1.5}, {"Hello": -0.25}]
    assert merged["text_offset"] == [0, 5, 11]
