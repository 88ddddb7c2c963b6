"""Results -> a markdown table and PNG plots (throughput vs concurrency, TTFT)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.stats import Summary, ratio


@dataclass(frozen=True)
class Row:
    server: str  # the PeerSpec label
    prompt_set: str
    concurrency: int
    summary: Summary
    round: int = 0


def representative(rows: Sequence[Row]) -> list[Row]:
    """Per server and scenario, the round with the median aggregate tok/s."""
    groups: dict[tuple[str, str, int], list[Row]] = {}
    for row in rows:
        groups.setdefault((row.server, row.prompt_set, row.concurrency), []).append(row)
    out = []
    for group in groups.values():
        ordered = sorted(group, key=lambda r: r.summary.aggregate_tok_s)
        out.append(ordered[(len(ordered) - 1) // 2])
    return out


def _fmt(value: float | None, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}f}"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def results_table(rows: Sequence[Row]) -> str:
    lines = [
        "| prompts | conc. | server | agg tok/s | per-req tok/s p50 | TTFT p50 / p90 / p99 s "
        "| ITL p50 / p99 ms | requests (errors) |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        s = r.summary
        ttft = f"{_fmt(s.ttft_s.p50, 2)} / {_fmt(s.ttft_s.p90, 2)} / {_fmt(s.ttft_s.p99, 2)}"
        itl = f"{_fmt(s.itl_s.p50 * 1000, 0)} / {_fmt(s.itl_s.p99 * 1000, 0)}"
        lines.append(
            f"| {r.prompt_set} | {r.concurrency} | {r.server} | {_fmt(s.aggregate_tok_s)} "
            f"| {_fmt(s.per_request_tok_s.p50)} | {ttft} | {itl} | {s.requests} ({s.errors}) |"
        )
    return "\n".join(lines)


def ratio_table(rows: Sequence[Row], subject: str, others: Sequence[str]) -> str:
    """subject's aggregate tok/s and TTFT p50 against each other server, scenario by scenario."""
    index = {(r.server, r.prompt_set, r.concurrency): r.summary for r in rows}
    scenarios = sorted({(r.prompt_set, r.concurrency) for r in rows if r.server == subject})
    header = "| prompts | conc. | " + " | ".join(f"tok/s vs {o} | TTFT vs {o}" for o in others)
    lines = [header + " |", "| --- | ---: |" + " ---: | ---: |" * len(others)]
    for prompt_set, conc in scenarios:
        mine = index[(subject, prompt_set, conc)]
        cells = []
        for other in others:
            theirs = index.get((other, prompt_set, conc))
            cells.append(
                _ratio(ratio(mine.aggregate_tok_s, theirs.aggregate_tok_s if theirs else None))
            )
            # TTFT: theirs / mine, so above 1 means vllm-mlx answers sooner.
            cells.append(_ratio(ratio(theirs.ttft_s.p50 if theirs else None, mine.ttft_s.p50)))
        lines.append(f"| {prompt_set} | {conc} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(rows: Sequence[Row], out_dir: Path, prefix: str) -> list[Path]:
    """One PNG per prompt set and metric; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written: list[Path] = []
    metrics: list[tuple[str, str, Any]] = [
        ("throughput", "aggregate generated tok/s", lambda s: s.aggregate_tok_s),
        ("ttft", "TTFT p50 (s)", lambda s: s.ttft_s.p50),
    ]
    for prompt_set in sorted({r.prompt_set for r in rows}):
        for metric, ylabel, value in metrics:
            fig, ax = plt.subplots(figsize=(7, 4.2))
            for server in dict.fromkeys(r.server for r in rows):
                points = sorted(
                    (r.concurrency, value(r.summary))
                    for r in rows
                    if r.server == server and r.prompt_set == prompt_set
                )
                if points:
                    xs, ys = zip(*points, strict=True)
                    ax.plot(xs, ys, marker="o", label=server)
            ax.set_xscale("log", base=2)
            ax.set_xlabel("concurrent streaming clients")
            ax.set_ylabel(ylabel)
            ax.set_title(f"{ylabel} - prompts: {prompt_set}")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7)
            path = out_dir / f"{prefix}-{metric}-{prompt_set}.png"
            fig.tight_layout()
            fig.savefig(path, dpi=110)
            plt.close(fig)
            written.append(path)
    return written
