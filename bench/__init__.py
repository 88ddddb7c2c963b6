"""Benchmarks for vllm-mlx: load generator, engine-only baseline, peers, report.

Run `python bench/run.py --quick` (or `--full`); results go to docs/benchmarks.md.
"""
