"""``benchmarks/online_users.py --quick``: simulated users against ``boltrl serve`` on the
tiny model, end to end (concurrent OpenAI clients, delayed feedback, silent users whose
sessions expire, learner rounds, the gate), then the plot of its summary."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "online_users.py"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(BENCH), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"},
    )


@pytest.mark.bench
def test_quick_run_and_plot(tmp_path: Path) -> None:
    proc = _run("--quick", "--scenario", "adversarial", "--out", str(tmp_path / "run"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["scenario"] == "adversarial" and s["quick"] is True
    assert s["sessions"] > 10 and s["failed_calls"] == 0
    assert set(s["by_kind"]) == {"lenient", "inverted", "random"}
    assert s["silent"] > 0 and s["expired"] > 0  # unrated sessions expire, are not trained
    assert s["ratings_sent"] > 0
    kinds = [d["decision"] for d in s["decisions"]]
    assert kinds[0] == "initial" and len(kinds) >= 2
    assert set(kinds[1:]) <= {"promote", "rollback", "skip"}
    assert s["served_version"] == kinds.count("promote")
    assert s["learner"]["sessions"] <= s["ratings_sent"]
    png = tmp_path / "curves.png"
    proc = _run("--plot", str(tmp_path / "run"), "--png", str(png))
    assert proc.returncode == 0, proc.stderr
    assert png.stat().st_size > 10_000
