"""Write one run's results: JSON (everything), markdown (tables, goals), PNG plots."""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench import report
from bench.peers import PeerSpec
from bench.stats import Summary, ratio


def _find(rows: Sequence[report.Row], prefix: str, prompt_set: str, conc: int) -> Summary | None:
    for row in rows:
        if (
            row.server.startswith(prefix)
            and row.prompt_set == prompt_set
            and row.concurrency == conc
        ):
            return row.summary
    return None


def round_ratios(rows: Sequence[report.Row], prompt_set: str, conc: int) -> list[float]:
    """vllm-mlx / mlx_lm.server (float32) aggregate tok/s, round by round."""
    out = []
    for index in sorted({r.round for r in rows}):
        in_round = [r for r in rows if r.round == index]
        ours = _find(in_round, "vllm-mlx (", prompt_set, conc)
        theirs = _find(in_round, "mlx_lm.server (float32", prompt_set, conc)
        value = ratio(
            ours.aggregate_tok_s if ours else None, theirs.aggregate_tok_s if theirs else None
        )
        if value is not None:
            out.append(value)
    return out


def goals(rows: Sequence[report.Row], baseline: dict[str, Any]) -> list[str]:
    """The issue's goals as measured ratios (short prompts)."""
    rounds = round_ratios(rows, "short", 16)
    rows = report.representative(rows)
    top = max(r.concurrency for r in rows if r.concurrency <= 16)
    ours16 = _find(rows, "vllm-mlx (", "short", top)
    mlx16 = _find(rows, "mlx_lm.server (float32", "short", top)
    llama16 = _find(rows, "llama-server", "short", top)
    ours1 = _find(rows, "vllm-mlx (", "short", 1)
    mlx1 = _find(rows, "mlx_lm.server (float32", "short", 1)
    stream = baseline.get("stream_generate", {}).get("decode_tok_s")

    def agg(s: Summary | None) -> float | None:
        return s.aggregate_tok_s if s else None

    def fmt(value: float | None, goal: str) -> str:
        return "not measured" if value is None else f"{value:.2f}x (goal {goal})"

    c1_rate = ours1.per_request_tok_s.p50 if ours1 else None
    ttft = ratio(mlx1.ttft_s.p50 if mlx1 else None, ours1.ttft_s.p50 if ours1 else None)
    return [
        f"- concurrency {top}, aggregate tok/s, vllm-mlx / mlx_lm.server (same weights and "
        f"BLAS): **{fmt(ratio(agg(ours16), agg(mlx16)), '>= 1.5x')}**"
        + (f" (each round: {', '.join(f'{r:.2f}x' for r in rounds)})" if len(rounds) > 1 else ""),
        f"- concurrency {top}, aggregate tok/s, vllm-mlx / llama-server: "
        f"**{fmt(ratio(agg(ours16), agg(llama16)), 'stretch >= 0.75x')}**",
        f"- concurrency 1, streamed decode tok/s through HTTP / engine-only stream_generate: "
        f"**{fmt(ratio(c1_rate, stream), '>= 0.95x')}**",
        f"- concurrency 1, TTFT p50 mlx_lm.server / vllm-mlx (above 1: vllm-mlx first): "
        f"**{fmt(ttft, '>= 1.0x')}**",
    ]


def baseline_table(baseline: dict[str, Any]) -> str:
    sg = baseline["stream_generate"]
    lines = [
        f"Weights {baseline['dtype']}, BLAS {baseline['blas']}.",
        "",
        "| engine-only | batch | tok/s | notes |",
        "| --- | ---: | ---: | --- |",
        f"| stream_generate | 1 | {sg['decode_tok_s']:.1f} | decode rate; TTFT "
        f"{sg['ttft_s']:.2f} s for {sg['prompt_tokens']} prompt tokens |",
    ]
    for b in baseline["batch"]:
        lines.append(
            f"| BatchGenerator | {b['batch_size']} | {b['aggregate_tok_s']:.1f} | "
            f"{b['completion_tokens']} tokens in {b['wall_s']:.1f} s incl. "
            f"{b['prefill_s']:.1f} s prefill |"
        )
    return "\n".join(lines)


def markdown(
    mode: str,
    info: dict[str, Any],
    specs: Sequence[PeerSpec],
    baseline: dict[str, Any],
    rows: Sequence[report.Row],
    plots: Sequence[Path],
    argv: Sequence[str] | None,
) -> str:
    command = "python bench/run.py " + shlex.join(list(argv or [f"--{mode}"]))
    command = command.replace(str(Path.home()), "~")
    machine_lines = [f"- {key}: {value}" for key, value in info.items()]
    skipped = [f"- {s.label}: skipped ({s.skip})" for s in specs if s.skip]
    all_rows, rows = rows, report.representative(rows)
    subject = next(r.server for r in rows if r.server.startswith("vllm-mlx ("))
    others = list(dict.fromkeys(r.server for r in rows if r.server != subject))
    parts = [
        f"# Benchmark results ({mode})",
        "",
        f"Reproduce: `{command}`",
        "",
        *machine_lines,
        "",
        "## Goals",
        "",
        *goals(all_rows, baseline),
        "",
        "## Engine-only baseline (mlx-lm in-process)",
        "",
        baseline_table(baseline),
        "",
        "## Servers",
        "",
        "Each row is the round with the median aggregate tok/s (JSON: every round).",
        "",
        report.results_table(rows),
        "",
        f"## {subject} relative to each peer",
        "",
        report.ratio_table(rows, subject, others),
        "",
        *(["## Skipped peers", "", *skipped, ""] if skipped else []),
        *[f"![{p.stem}]({p.name})" for p in plots],
        "",
    ]
    return "\n".join(parts)


def write_results(
    out_dir: Path,
    mode: str,
    info: dict[str, Any],
    specs: Sequence[PeerSpec],
    baseline: dict[str, Any],
    rows: Sequence[report.Row],
    plan: Any,
    argv: Sequence[str] | None,
) -> list[Path]:
    plots = report.plot(report.representative(rows), out_dir, mode)
    md = out_dir / f"results-{mode}.md"
    md.write_text(markdown(mode, info, specs, baseline, rows, plots, argv))
    data = {
        "machine": info,
        "plan": asdict(plan),
        "skipped": {s.label: s.skip for s in specs if s.skip},
        "engine_baseline": baseline,
        "rows": [asdict(r) for r in rows],
    }
    js = out_dir / f"results-{mode}.json"
    js.write_text(json.dumps(data, indent=1, default=str))
    return [md, js, *plots]
