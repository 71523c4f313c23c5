"""Held-out reward against training time, boltrl beside TRL, from a ``trl`` workload run.

Reads what ``benchmarks/run.py --peer --workloads trl`` leaves: its log folder (the first
line it prints, ``logs of every process: DIR``), where each boltrl run's
``boltrl-seed{i}/metrics.jsonl`` holds its validations and step times, and its standard
output (save it with ``tee``), whose ``trl workload, round N, SIDE: {...}`` lines hold each
run's figures (TRL's training time and its held-out reward before and after).

    uv run python benchmarks/run.py --peer --rounds 2 --workloads trl | tee trl.log
    uv run python benchmarks/plot_trl.py --stdout trl.log --png benchmarks/trl_side_by_side.png

boltrl's line is the validation at each step against the sum of its step times so far
(the same clock as TRL's ``train_s``: training only, validations and model load left
out); TRL's two points are its validation before training and after ``train_s``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent / "sbs"))
from trl_workload import val_curve  # benchmarks/sbs is not a package

_RUN = re.compile(r"trl workload, round (\d+), (boltrl|trl): (\{.*\})\s*$")


def read_runs(stdout: Path) -> tuple[Path, list[tuple[int, str, dict[str, Any]]]]:
    """The log folder and each ``(round, side, figures)`` line of a run's output."""
    text = stdout.read_text()
    m = re.search(r"logs of every process: (\S+)", text)
    if m is None:
        raise SystemExit(f"{stdout}: no 'logs of every process:' line (run.py's output?)")
    runs = [
        (int(r[1]), r[2], json.loads(r[3]))
        for line in text.splitlines()
        if (r := _RUN.search(line)) is not None
    ]
    if not runs:
        raise SystemExit(f"{stdout}: no 'trl workload, round' lines")
    return Path(m[1]), runs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--stdout", type=Path, required=True, help="run.py's saved output")
    ap.add_argument("--logs", type=Path, help="its log folder (default: named in --stdout)")
    ap.add_argument("--png", type=Path, required=True)
    args = ap.parse_args()
    logs, runs = read_runs(args.stdout)
    logs = args.logs or logs

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    colors = ["tab:blue", "tab:cyan", "tab:purple"]
    for rnd, side, r in runs:
        seed = rnd - 1
        if side == "boltrl":
            metrics = (logs / f"boltrl-seed{seed}" / "metrics.jsonl").read_text()
            pts = val_curve([json.loads(x) for x in metrics.splitlines() if x.strip()])
            ax.plot(
                *zip(*pts, strict=True),
                marker=".",
                color=colors[seed % 3],
                label=f"boltrl, seed {seed}",
            )
        else:
            ax.plot(
                [0, r["train_s"]],
                [r["val_before"], r["val_after"]],
                marker="o",
                linestyle="--",
                color=["tab:red", "tab:orange"][seed % 2],
                label=f"TRL GRPOTrainer, seed {seed}",
            )
            ax.axvline(r["train_s"], color="0.85", linewidth=0.8, zorder=0)
    ax.set_xlabel("training time (s): generation + update, validations excluded")
    ax.set_ylabel("held-out reward (64 problems, greedy)")
    ax.set_title("The demo task, same model, LoRA, group size, lr; 2 cores")
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.png, dpi=110)
    print(f"wrote {args.png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
