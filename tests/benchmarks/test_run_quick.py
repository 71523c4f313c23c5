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
