"""The bundled model through the quantized CPU kernel against today's float32 path.

Greedy output must be identical, or differ only from a step where the float32 path's two
best logits are within 1e-3 of each other (a near tie either path may break either way).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_mlx.models.cpu import qmm

TIE = 1e-3
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not qmm.status().available, reason=f"kernel: {qmm.status().detail}")
@pytest.mark.timeout(600)
def test_greedy_output_matches_the_float32_path(model_cache_dir: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.qmm_compare", str(model_cache_dir)],
        capture_output=True,
        text=True,
        timeout=580,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["kernel_layers"] and not result["float32_layers_swapped"]
    differing = [
        (row["prompt"], row["first_difference"], row["gaps"][row["first_difference"]])
        for row in result["prompts"]
        if row["first_difference"] is not None
    ]
    total = len(result["prompts"])
    print(f"\n{total - len(differing)}/{total} prompts identical; differing: {differing}")
    assert total == 10 and all(gap < TIE for _, _, gap in differing), differing
