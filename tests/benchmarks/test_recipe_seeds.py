"""``benchmarks/recipe_seeds.py --merge``: the tables and curve of seeds run by separate
invocations come from their results files, with the same mean ± std a single run prints."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "recipe_seeds.py"
CONFIG = ROOT / "examples" / "calc_agent" / "train.yaml"


def _seed(seed: int, warm: float, rl: float, test: tuple[float, float]) -> dict[str, Any]:
    return {
        "seed": seed,
        "base": 0.0,
        "warm": warm,
        "rl": rl,
        "groups": 10.0 + seed,
        "shaping": 0.0,
        "wall_s": 1000.0 + seed,
        "load": [1.0, 1.5],
        "curve": [[900.0, warm], [1000.0 + seed, rl]],
        "test": {"warm": test[0], "rl": test[1]},
    }


def _merge(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, str(SCRIPT), str(CONFIG), "--merge", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_merge_prints_every_seed_sorted_with_mean_std_test_and_curve(tmp_path: Path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps([_seed(2, 0.5, 0.8, (0.4, 0.5))]))
    b.write_text(json.dumps([_seed(0, 0.4, 0.5, (0.4, 0.6)), _seed(1, 0.3, 0.5, (0.5, 0.6))]))
    png = tmp_path / "curve.png"
    proc = _merge(str(a), str(b), "--png", str(png))
    assert proc.returncode == 0, proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| ")]
    # seed table: header, three seeds in seed order, summary; test table likewise
    assert [r.split("|")[1].strip() for r in rows[1:5]] == ["0", "1", "2", "mean ± std"]
    assert "| 2 | 0.000 | 0.500 | 0.800 | +0.300 | 12 (0) | 1002 | 1.0 → 1.5 |" in rows
    # RL gains +0.1, +0.2, +0.3: mean +0.200, sample std 0.100
    assert "+0.200 ± 0.100" in rows[4]
    # test gains +0.2, +0.1, +0.1
    assert rows[-1].startswith("| mean ± std | 0.433 ± 0.058 | 0.567 ± 0.058 | +0.133 ± 0.058 |")
    assert png.stat().st_size > 1000


def test_merge_refuses_a_seed_in_two_files_and_names_both(tmp_path: Path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps([_seed(0, 0.4, 0.5, (0.4, 0.6))]))
    b.write_text(json.dumps([_seed(0, 0.4, 0.6, (0.4, 0.6))]))
    proc = _merge(str(a), str(b))
    assert proc.returncode != 0
    assert f"seed 0 is in both {a} and {b}" in proc.stderr


def test_merge_names_a_file_it_cannot_read(tmp_path: Path) -> None:
    missing = tmp_path / "nope.json"
    proc = _merge(str(missing))
    assert proc.returncode != 0
    assert f"cannot read {missing}" in proc.stderr


def test_merge_refuses_a_file_that_is_not_a_results_file(tmp_path: Path) -> None:
    other = tmp_path / "metrics.json"
    other.write_text(json.dumps([{"step": 1, "val/reward_mean": 0.5}]))
    proc = _merge(str(other))
    assert proc.returncode != 0
    assert f"{other} is not a recipe_seeds results file" in proc.stderr
