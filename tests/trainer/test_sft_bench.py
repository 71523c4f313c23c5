"""benchmarks/sft_bench.py runs on sql_agent's real demonstrations with the tiny model:
prefix packing runs fewer decoder positions than length packing, for the same loss (the
module is slow-marked: each test runs the example's agent on 16 training tasks; the packing
itself is tested in test_batching.py and test_sft.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from boltrl_trainer.models import tiny_model

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _run(tmp_path: Path, *extra: str) -> tuple[dict[str, dict[str, float]], str]:
    out = tmp_path / "sft.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "sft_bench.py"),
            "examples/sql_agent/train.yaml",
            "--model",
            str(tiny_model()),
            "--limit",
            "16",
            "--batch",
            "16",
            "--json",
            str(out),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return {r["packing"]: r for r in json.loads(out.read_text())}, proc.stdout


def test_counts_positions_on_sql_agent(tmp_path: Path) -> None:
    rows, stdout = _run(tmp_path, "--positions-only")
    assert rows["prefix"]["positions"] < rows["length"]["positions"] <= rows["plain"]["positions"]
    assert "| prefix | - |" in stdout


def test_runs_on_sql_agent_with_the_tiny_model(tmp_path: Path) -> None:
    rows, stdout = _run(tmp_path, "--batches", "1")
    assert set(rows) == {"prefix", "length", "plain"}
    # 8 writer + 8 checker calls a step: packed by prompt, each agent's shared prompt runs once
    assert rows["prefix"]["positions"] < rows["length"]["positions"] <= rows["plain"]["positions"]
    for way in ("length", "plain"):
        assert rows[way]["loss"] == pytest.approx(rows["prefix"]["loss"], rel=1e-4)
    assert "| prefix |" in stdout
