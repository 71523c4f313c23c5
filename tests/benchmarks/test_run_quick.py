"""``benchmarks/run.py --quick`` keeps working: it runs every workload and prints the
table (the figures are not checked, only that they are produced)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "benchmarks" / "run.py"
WORKLOADS = ["1 · capture", "2 · proxy", "3 · store", "4 · trace → training data"]
HEADER = "| workload | measure | boltrl | Agent Lightning | boltrl / AL | boltrl ahead |"


def _run(tmp_path: Path, *flags: str, timeout: float) -> tuple[str, dict[str, object]]:
    out = tmp_path / "rows.json"
    proc = subprocess.run(
        [sys.executable, str(RUN), "--quick", "--no-readme", "--json", str(out), *flags],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout, json.loads(out.read_text())


def _check_table(stdout: str, data: dict[str, object], *, peer: bool) -> None:
    assert HEADER in stdout
    for workload in WORKLOADS:
        assert f"| {workload}" in stdout, workload
    rows = data["rows"]
    assert isinstance(rows, list) and len(rows) >= 12
    for row in rows:
        assert isinstance(row["boltrl"], float), row
        if peer and not row["measure"].startswith("agent run, no capture"):
            assert isinstance(row["peer"], float) and isinstance(row["ratio"], float), row
        if not peer:
            assert row["peer"] is None and row["ratio"] is None, row


@pytest.mark.bench
def test_quick_boltrl_only(tmp_path: Path) -> None:
    stdout, data = _run(tmp_path, timeout=120)
    _check_table(stdout, data, peer=False)
    notes = "\n".join(data["notes"])  # type: ignore[arg-type]
    assert '"model calls": 2' in notes and '"tool steps": 1' in notes


@pytest.mark.slow
def test_quick_with_peer(tmp_path: Path) -> None:
    """Builds benchmarks/.peer-venv on first use (several minutes, needs PyPI)."""
    stdout, data = _run(tmp_path, "--peer", timeout=1800)
    _check_table(stdout, data, peer=True)


def _load_run() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_run", RUN)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_section_is_replaced_between_markers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = _load_run()
    readme = tmp_path / "README.md"
    readme.write_text("# Benchmarks\n\n## Store\n\nfigures\n")
    monkeypatch.setattr(run, "README", readme)
    run.write_readme("first")
    assert readme.read_text() == (
        "# Benchmarks\n\n## Store\n\nfigures\n\n## Side by side with Agent Lightning\n\n"
        "<!-- peer:begin -->\nfirst\n<!-- peer:end -->\n"
    )
    readme.write_text(readme.read_text() + "\n## Later section\n\nkept\n")
    run.write_readme("second")
    text = readme.read_text()
    assert "first" not in text and "<!-- peer:begin -->\nsecond\n<!-- peer:end -->" in text
    assert text.startswith("# Benchmarks\n\n## Store\n\nfigures\n") and text.endswith("kept\n")


TRL_MEASURES = [
    "seconds per step (median)",
    "training wall time",
    "generated tokens/s",
    "peak memory (RSS)",
    "held-out reward after training",
    "held-out gain",
    "held-out reward at TRL's training time",
]


def _check_trl(stdout: str, data: dict[str, object], *, peer: bool) -> None:
    assert "| measure | boltrl | TRL | boltrl / TRL | boltrl ahead |" in stdout
    rows = data["rows"]
    assert isinstance(rows, list)
    assert [r["measure"] for r in rows] == TRL_MEASURES
    for row in rows:
        assert isinstance(row["boltrl"], float), row
        assert isinstance(row["peer"], float) if peer else row["peer"] is None, row
    by = {r["measure"]: r["boltrl"] for r in rows}
    assert by["seconds per step (median)"] > 0 and by["generated tokens/s"] > 0
    assert 100 < by["peak memory (RSS)"] < 8000  # MB of a real child process
    runs = data["trl_runs"]
    assert isinstance(runs, dict) and set(runs) == ({"boltrl", "trl"} if peer else {"boltrl"})
    for side_runs in runs.values():
        (run,) = side_runs
        assert 0.0 <= run["val_before"] <= 1.0 and 0.0 <= run["val_after"] <= 1.0
        assert 0.0 <= run["val_equal_time"] <= 1.0
    (b,) = runs["boltrl"]
    # boltrl ran twice the steps; its equal-time figure is one of its validations, taken
    # within TRL's training time when TRL ran
    assert b["steps_run"] == 2
    curve = b["val_curve"]
    assert any(abs(t - b["equal_time_s"]) < 1e-3 and v == b["val_equal_time"] for t, v in curve)
    if peer:
        assert b["equal_time_s"] <= runs["trl"][0]["train_s"] or b["equal_time_s"] == min(
            t for t, _ in curve
        )


@pytest.mark.bench
def test_quick_trl_boltrl_side(tmp_path: Path) -> None:
    """The ``trl`` workload's boltrl side: ``boltrl demo`` on the tiny model, one step."""
    stdout, data = _run(tmp_path, "--workloads", "trl", timeout=300)
    _check_trl(stdout, data, peer=False)
    # benchmarks/plot_trl.py draws the run from its output and log folder
    saved, png = tmp_path / "trl.log", tmp_path / "trl.png"
    saved.write_text(stdout)
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks/plot_trl.py"),
            "--stdout",
            str(saved),
            "--png",
            str(png),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert png.stat().st_size > 5000


@pytest.mark.slow
def test_quick_trl_with_peer(tmp_path: Path) -> None:
    """Builds benchmarks/.trl-venv on first use (several minutes, needs PyPI)."""
    stdout, data = _run(tmp_path, "--peer", "--workloads", "trl", timeout=1800)
    _check_trl(stdout, data, peer=True)


def test_trl_side_scores_as_the_demo() -> None:
    """TRL's side repeats the demo's reward (its venv has no boltrl): they must agree."""
    from boltrl_trainer.demo import score

    spec = importlib.util.spec_from_file_location("trl_side", ROOT / "benchmarks/sbs/trl_side.py")
    assert spec is not None and spec.loader is not None
    trl_side = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(trl_side)
    replies = [
        "42",
        " 42.",
        "1,042",
        "The answer is 42.",
        "12 + 30 = 42",
        "41",
        "",
        "-42",
        "42 apples",
        "4 2",
        "42\n",
        "answer: 43 or 42",
        "1042",
        "forty-two",
    ]
    for reply in replies:
        for answer in (42, 1042, -42):
            assert trl_side.score(reply, answer) == score(reply, answer), (reply, answer)
    assert trl_side.PROMPT == __import__("boltrl_trainer.demo").demo.PROMPT
