"""benchmarks/demo_ceiling.py sorts replies as the demo's scorer pays them, and runs."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from boltrl_trainer.models import tiny_model

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "demo_ceiling.py"


def _module() -> object:
    spec = importlib.util.spec_from_file_location("demo_ceiling", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize(
    ("reply", "kind"),
    [
        ("42", "bare right"),
        (" 42.", "bare right"),
        ("43", "bare wrong"),
        ("12 + 30 = 42", "words right"),
        ("12 + 30 = 43", "other"),
        ("To solve this", "other"),
    ],
)
def test_kinds_follow_the_demo_score(reply: str, kind: str) -> None:
    assert _module().kind(reply, 42) == kind  # type: ignore[attr-defined]


@pytest.mark.bench
def test_runs_on_the_tiny_model(tmp_path: Path) -> None:
    out = tmp_path / "ceiling.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--model",
            str(tiny_model()),
            "--limit",
            "3",
            "--samples",
            "2",
            "--temperatures",
            "1.0",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(out.read_text())
    assert [(r["temperature"], r["replies"]) for r in rows] == [(0.0, 3), (1.0, 6)]
    for r in rows:
        shares = [r[k] for k in ("bare right", "bare wrong", "words right", "other")]
        assert sum(shares) == pytest.approx(1.0)
        assert r["mean reward"] == pytest.approx(r["bare right"] + 0.5 * r["words right"])
    assert "| greedy | 3 |" in proc.stdout
