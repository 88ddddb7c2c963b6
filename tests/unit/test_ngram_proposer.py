"""Prompt lookup's proposer (engine/speculative/ngram.py) and the `speculative` section
that configures it: what is proposed, from where, and errors at file:line."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from vllm_mlx.cli.main import main
from vllm_mlx.config.errors import ConfigError
from vllm_mlx.config.file import load_settings
from vllm_mlx.engine.scheduler_state import SchedulerConfig, with_speculative
from vllm_mlx.engine.speculative.config import SpeculativeConfig
from vllm_mlx.engine.speculative.ngram import NgramProposer
from vllm_mlx.engine.speculative.plan import choose_width

CONFIG = SpeculativeConfig(num_tokens=4, ngram_min=2, ngram_max=3)


def brute_force(tokens: list[int], limit: int, lo: int, hi: int) -> list[int]:
    """The definition: for the longest n with an earlier occurrence of the last n
    tokens, what followed the latest such occurrence."""
    for n in range(hi, lo - 1, -1):
        if n > len(tokens):
            continue
        tail = tokens[-n:]
        for end in range(len(tokens) - 1, n - 1, -1):
            if tokens[end - n : end] == tail:
                return tokens[end : end + limit]
    return []


def test_proposes_what_followed_the_latest_earlier_occurrence() -> None:
    proposer = NgramProposer(CONFIG, [5, 6, 7, 8, 9, 1, 5, 6, 7, 2, 3, 6, 7])
    # The tail (6, 7) occurred twice before; the latest is followed by 2, 3, 6, 7.
    assert proposer.propose(4) == [2, 3, 6, 7]
    assert proposer.propose(2) == [2, 3]
    proposer.append(2)  # (6, 7, 2) occurred once: followed by 3, 6, 7, 2
    assert proposer.propose(8) == [3, 6, 7, 2]


def test_the_longest_matching_tail_wins() -> None:
    # (1, 2) last occurred before 9, but (0, 1, 2) occurred before 4.
    proposer = NgramProposer(CONFIG, [0, 1, 2, 4, 4, 1, 2, 9, 9, 0, 1, 2])
    assert proposer.propose(2) == [4, 4]


def test_nothing_without_an_earlier_occurrence() -> None:
    proposer = NgramProposer(CONFIG, [1, 2, 3, 4])
    assert not proposer.has_match() and proposer.propose(4) == []
    proposer.append(1)  # a repeated single token is below ngram_min
    assert not proposer.has_match() and proposer.propose(4) == []
    proposer.append(2)
    assert proposer.has_match() and proposer.propose(4) == [3, 4, 1, 2]
    assert proposer.propose(0) == []


def test_catch_up_appends_only_what_is_new() -> None:
    record = [1, 2, 3, 1, 2]
    proposer = NgramProposer(CONFIG, record[:2])
    proposer.catch_up(record)
    proposer.catch_up(record)
    assert proposer.tokens == record and proposer.propose(3) == [3, 1, 2]


@pytest.mark.parametrize("seed", range(5))
def test_matches_the_definition_on_random_sequences(seed: int) -> None:
    rng = random.Random(seed)
    tokens = [rng.randrange(6) for _ in range(300)]
    lo, hi = rng.randint(1, 3), 4
    proposer = NgramProposer(SpeculativeConfig(5, lo, hi))
    for end in range(1, len(tokens) + 1):
        proposer.append(tokens[end - 1])
        assert proposer.propose(5) == brute_force(tokens[:end], 5, lo, hi)


def test_config_bounds() -> None:
    with pytest.raises(ValueError, match="ngram_min"):
        SpeculativeConfig(4, 3, 2)
    with pytest.raises(ValueError, match="num_tokens"):
        SpeculativeConfig(0, 1, 2)


def test_the_plan_checks_proposals_only_when_they_are_expected_to_pay() -> None:
    # One row, likely proposals: check them all; unlikely ones: the plain step.
    assert choose_width(1, [(4, 0.8)]) == 4
    assert choose_width(1, [(4, 0.1)]) == 0
    # In a batch every row pays for the positions: one good row does not carry three.
    assert choose_width(4, [(4, 0.8)]) == 0
    assert choose_width(4, [(4, 0.8)] * 4) == 4
    assert choose_width(4, [(4, 0.8)], position_cost=0.0) == 4
    assert choose_width(3, []) == 0


# --- the `models[].speculative` section --------------------------------------------------

MODEL = "models:\n  - name: smol\n    source: builtin:smollm2-135m-instruct\n"


def issues_of(path: Path) -> list[tuple[int | None, str, str]]:
    with pytest.raises(ConfigError) as caught:
        load_settings(path)
    return [(i.line, i.key_path, i.message) for i in caught.value.issues]


def test_off_by_default_and_a_section_reaches_the_engine(tmp_path: Path) -> None:
    path = tmp_path / "vllm-mlx.yaml"
    path.write_text(MODEL)
    spec = load_settings(path).models[0].speculative
    assert spec.method is None
    assert with_speculative(SchedulerConfig(), spec).speculative is None
    path.write_text(MODEL + "    speculative: {method: ngram, num_tokens: 8, ngram_max: 5}\n")
    spec = load_settings(path).models[0].speculative
    assert (spec.method, spec.num_tokens, spec.ngram_min, spec.ngram_max) == ("ngram", 8, 2, 5)
    chosen = with_speculative(SchedulerConfig(), spec).speculative
    assert chosen == SpeculativeConfig(num_tokens=8, ngram_min=2, ngram_max=5)


@pytest.mark.parametrize(
    ("section", "line", "key", "words"),
    [
        ("    speculative:\n      method: eagle\n", 5, "models[0].speculative.method", "ngram"),
        (
            "    speculative:\n      method: ngram\n      num_tokens: 17\n",
            6,
            "models[0].speculative.num_tokens",
            "less than or equal to 16",
        ),
        (
            "    speculative:\n      num_tokens: 0\n",
            5,
            "models[0].speculative.num_tokens",
            "greater than or equal to 1",
        ),
        (
            "    speculative:\n      ngram_min: 5\n      ngram_max: 3\n",
            5,
            "models[0].speculative.ngram_min",
            "must not exceed ngram_max",
        ),
        ("    speculative:\n      k: 4\n", 5, "models[0].speculative.k", "unknown key"),
        (
            "    task: embed\n    speculative:\n      method: ngram\n",
            6,
            "models[0].speculative.method",
            "applies to generation models",
        ),
    ],
)
def test_a_bad_section_is_named_at_its_line(
    tmp_path: Path, section: str, line: int, key: str, words: str
) -> None:
    path = tmp_path / "vllm-mlx.yaml"
    path.write_text(MODEL + section)
    ((at, key_path, message),) = issues_of(path)
    assert (at, key_path) == (line, key)
    assert words in message


def test_a_quantized_kv_cache_may_speculate(tmp_path: Path) -> None:
    """kv_cache.bits and speculative together (refused until the quantized rewind)."""
    path = tmp_path / "vllm-mlx.yaml"
    path.write_text(MODEL + "    kv_cache: {bits: 8}\n    speculative:\n      method: ngram\n")
    model = load_settings(path).models[0]
    assert model.kv_cache.bits == 8 and model.speculative.method == "ngram"


def test_check_config_reports_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "vllm-mlx.yaml"
    path.write_text(MODEL + "    speculative:\n      num_tokens: 40\n")
    with pytest.raises(SystemExit) as exited:
        main(["check-config", str(path)])
    assert exited.value.code == 1
    err = capsys.readouterr().err
    assert f"{path}:5:7: models[0].speculative.num_tokens: Input should be less than" in err


def test_a_row_whose_estimate_fell_is_checked_again_later() -> None:
    from vllm_mlx.engine.speculative.verify import _Row

    def width(rate: float) -> int:  # one row, a draft pass at 0.2 of a step
        return choose_width(1, [(1, rate)], draft_cost=0.2)

    row = _Row(None, limit=4)
    for _ in range(3):  # three passes that accepted nothing
        row.update(drafted=row.limit, accepted=0, most=4)
    assert row.pause == 8 and width(row.rate) == 0
    declined = 0
    while width(row.rate) == 0:  # the plan declines, step after step
        row.declined()
        declined += 1
        assert declined < 200, "never checked again"
    assert 10 < declined < 100, declined
    row.update(drafted=1, accepted=0, most=4)  # the probe fails too
    assert row.pause == 16 and width(row.rate) == 0
    row.update(drafted=1, accepted=1, most=4)  # a later probe that is accepted
    assert row.misses == 0 and row.limit == 2


def test_a_reference_is_proposed_from_and_the_sequence_takes_over() -> None:
    prompt = [1, 2, 3, 4, 5]
    prediction = [40, 41, 42, 43, 44, 45]
    proposer = NgramProposer(CONFIG, prompt, reference=[*prompt[-3:], *prediction])
    assert len(proposer) == len(prompt)  # the reference is not the sequence
    # The prompt's tail occurred in the reference, followed by the prediction's start.
    assert proposer.has_match() and proposer.propose(4) == [40, 41, 42, 43]
    proposer.catch_up([*prompt, 40, 41])  # the reply follows the prediction
    assert proposer.propose(3) == [42, 43, 44]
    proposer.catch_up([*prompt, 40, 41, 7, 8, 40, 41])  # the reply's own text is later
    assert proposer.propose(3) == [7, 8, 40]
