"""``benchmarks/async_bench.py --quick``: both arms run on the tiny model, same steps, and
the figures it reports are there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.bench
def test_async_bench_quick_runs_both_arms(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    script = str(ROOT / "benchmarks" / "async_bench.py")
    args = ["--out", str(tmp_path / "runs"), "--json", str(out), "--png", str(tmp_path / "p.png")]
    proc = subprocess.run(
        [sys.executable, script, "--quick", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    arms = json.loads(out.read_text())
    assert [a["arm"] for a in arms] == ["sync", "async"]
    assert all(a["steps"] == 3 and a["steps_per_min"] > 0 for a in arms)
    assert all([s for s, _, _ in a["val"]] == [0, 2, 3] for a in arms)
    assert arms[1]["dropped"] == 0
    assert "on separate devices" in proc.stdout and (tmp_path / "p.png").stat().st_size > 1000
