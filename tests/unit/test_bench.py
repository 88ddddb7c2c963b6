"""The benchmark harness's pure parts: statistics, SSE folding, prompts, report tables."""

from __future__ import annotations

import datetime
import math
from pathlib import Path

import pytest
from bench import report
from bench.loadgen import Scenario, apply_event, check_loopback, request_body
from bench.peers import parse_models_json
from bench.prompts import PROMPT_SETS
from bench.run import requests_per_client
from bench.stats import Distribution, RequestResult, percentile, ratio, summarize


def test_percentile_interpolates_like_numpy() -> None:
    values = [4.0, 1.0, 3.0, 2.0]
    assert percentile(values, 0) == 1.0
    assert percentile(values, 50) == 2.5
    assert percentile(values, 90) == pytest.approx(3.7)
    assert percentile(values, 100) == 4.0
    assert percentile([7.0], 99) == 7.0


def test_percentile_of_nothing_is_nan_and_out_of_range_is_an_error() -> None:
    assert math.isnan(percentile([], 50))
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_distribution_of_values() -> None:
    dist = Distribution.of([1.0, 2.0, 3.0])
    assert (dist.p50, dist.mean, dist.count) == (2.0, 2.0, 3)


def stream(started: float, chunks: list[float], tokens: int) -> RequestResult:
    return RequestResult(
        started=started,
        first_token=chunks[0],
        finished=chunks[-1],
        chunk_times=chunks,
        completion_tokens=tokens,
    )


def test_request_timings() -> None:
    result = stream(10.0, [10.5, 10.7, 10.9, 11.1, 11.3], 5)
    assert result.ttft == pytest.approx(0.5)
    assert result.decode_rate() == pytest.approx(4 / 0.8)
    assert result.inter_token_latencies() == pytest.approx([0.2] * 4)


def test_inter_token_latency_divides_multi_token_chunks() -> None:
    # stream_interval 2: three chunks carry five tokens, so each gap spans two tokens.
    result = stream(0.0, [1.0, 1.4, 1.8], 5)
    assert result.inter_token_latencies() == pytest.approx([0.2, 0.2])


def test_summary_counts_errors_and_aggregates_only_successes() -> None:
    good = [stream(0.0, [1.0, 2.0], 10), stream(0.0, [1.5, 4.0], 30)]
    bad = RequestResult(started=0.5, error="HTTP 500: boom")
    summary = summarize([*good, bad])
    assert summary.requests == 3 and summary.errors == 1
    assert summary.completion_tokens == 40
    assert summary.wall_s == pytest.approx(4.0)
    assert summary.aggregate_tok_s == pytest.approx(10.0)
    assert summary.ttft_s.p50 == pytest.approx(1.25)
    assert summary.error_samples == ("HTTP 500: boom",)


def test_ratio_is_none_when_a_side_is_missing() -> None:
    assert ratio(3.0, 2.0) == 1.5
    assert ratio(None, 2.0) is None and ratio(1.0, 0.0) is None and ratio(math.nan, 1.0) is None


def test_sse_events_fold_into_the_result() -> None:
    result = RequestResult(started=0.0)
    apply_event(result, {"choices": [{"delta": {"role": "assistant", "content": ""}}]}, 0.1)
    apply_event(result, {"choices": [{"delta": {"content": "Hel"}}]}, 0.2)
    apply_event(result, {"choices": [{"delta": {"content": "lo"}}]}, 0.3)
    apply_event(result, {"choices": [], "usage": {"completion_tokens": 2}}, 0.4)
    assert result.first_token == 0.2 and result.chunk_times == [0.2, 0.3]
    assert result.completion_tokens == 2 and result.error is None


def test_an_error_event_marks_the_request_failed() -> None:
    result = RequestResult(started=0.0)
    apply_event(result, {"error": {"message": "engine error: boom"}}, 0.1)
    assert result.error == "engine error: boom"


def test_only_loopback_servers_are_driven() -> None:
    check_loopback("http://127.0.0.1:8000")
    check_loopback("http://localhost:9")
    with pytest.raises(ValueError, match="loopback"):
        check_loopback("http://example.com:8000")


def test_request_body_asks_for_a_stream_with_usage() -> None:
    scenario = Scenario(PROMPT_SETS["short"], 4, 2, 32, 60.0)
    body = request_body("m", scenario, 3)
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 32 and body["temperature"] == 0.0


def test_prompts_are_distinct_except_the_shared_prefix() -> None:
    short, long600, prefix = (PROMPT_SETS[n] for n in ("short", "long600", "prefix2k"))
    assert short.messages(0) != short.messages(1)
    assert long600.messages(0) != long600.messages(1)
    assert len(long600.messages(0)[0]["content"].split()) > 350
    first, second = prefix.messages(0), prefix.messages(1)
    assert first[0] == second[0] and first[1] != second[1]
    assert short.messages(5) == short.messages(5)


def test_models_json_is_found_after_log_lines() -> None:
    text = '2026-01-01 [debug] gguf_import_cache_hit x=1\n[\n {"name": "m", "directory": "/d"}\n]\n'
    assert parse_models_json(text) == [{"name": "m", "directory": "/d"}]
    assert parse_models_json('[{"name": "m"}]') == [{"name": "m"}]
    with pytest.raises(ValueError):
        parse_models_json("no json here")


def test_every_scenario_has_at_least_four_requests() -> None:
    for concurrency in (1, 4, 8, 16):
        assert concurrency * requests_per_client(concurrency) >= 4
    assert requests_per_client(32) == 1


def test_report_tables_show_each_server_and_ratio() -> None:
    fast = summarize([stream(0.0, [0.5, 2.0], 40)])
    slow = summarize([stream(0.0, [1.0, 4.0], 40)])
    rows = [
        report.Row("vllm-mlx (x)", "short", 16, fast),
        report.Row("peer", "short", 16, slow),
    ]
    table = report.results_table(rows)
    assert "| short | 16 | vllm-mlx (x) | 20.0 |" in table and "| peer |" in table
    ratios = report.ratio_table(rows, "vllm-mlx (x)", ["peer"])
    assert "| short | 16 | 2.00x | 2.00x |" in ratios


def test_startup_reads_listening_and_the_first_model_ready_from_the_log(tmp_path: Path) -> None:
    from bench.startup import log_seconds

    log = tmp_path / "daemon.log"
    log.write_text(
        "not json\n"
        '{"event": "listening", "timestamp": "2026-12-07T03:00:03.500000Z"}\n'
        '{"event": "model ready", "timestamp": "2026-12-07T03:00:05.250000Z"}\n'
        '{"event": "model ready", "timestamp": "2026-12-07T03:00:09.000000Z"}\n'
        '{"event": "listening"}\n'
    )
    started = datetime.datetime(2026, 12, 7, 3, 0, 0, tzinfo=datetime.UTC).timestamp()
    assert log_seconds(log, started) == {"listening": 3.5, "model ready": 5.25}


def test_the_near_linear_figure_by_means_medians_and_rounds(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """One slow short prompt moves the means' ratio; the medians' and each round's show it."""
    from bench.prefill import near_linear

    near_linear("ours", [8.0, 8.0, 8.0], [1.0, 1.0, 2.0], [8.0, 8.0, 8.0])
    line = capsys.readouterr().out
    assert "the 4096 / 512 time ratio is 6.0x (means), 8.0x (medians) for 8.0x the tokens" in line
    assert line.strip().endswith("per round, over its token ratio: 1.00x, 1.00x, 0.50x")
