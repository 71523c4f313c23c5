"""Held-out reward against wall time for finished runs, read from their metrics files.

Each ``--run LABEL=DIR`` is one line: the validations of ``DIR/warm_start/metrics.jsonl``
(the base model, when the warm start validated it) then of ``DIR/metrics.jsonl`` (after
the warm start, during and after RL). ``LABEL=DIR1+DIR2`` chains a recipe that ran as two
processes — a warm start, then RL from its checkpoint with ``init_from`` — the second's
first validation (the same greedy model) joined to the first's last, so the line reads as
one run without the time between the two.

    uv run python benchmarks/plot_runs.py --run "seed 0=runs/a/seed-0+runs/a-rl" \\
        --png examples/rag_agent/learning_curve.png --title "rag_agent"
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _val(path: Path) -> list[tuple[float, float]]:
    if not path.is_file():
        return []
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return [(r["time"], r["val/reward_mean"]) for r in rows if "val/reward_mean" in r]


def curve(dirs: list[Path]) -> list[tuple[float, float]]:
    """(seconds from the run's first validation, reward) over the chained run folders."""
    points: list[tuple[float, float]] = []
    for i, d in enumerate(dirs):
        pts = _val(d / "warm_start" / "metrics.jsonl") + _val(d / "metrics.jsonl")
        if not pts:
            raise SystemExit(f"{d}: no validation rows in its metrics files")
        if i and points:  # join this run's first validation to the previous run's last
            shift = points[-1][0] - pts[0][0]
            pts = [(t + shift, v) for t, v in pts[1:]]
        points.extend(pts)
    t0 = points[0][0]
    return [(t - t0, v) for t, v in points]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--run", action="append", required=True, help="LABEL=DIR[+DIR...]")
    ap.add_argument("--png", required=True)
    ap.add_argument("--title", default="held-out reward")
    args = ap.parse_args()

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    for spec in args.run:
        label, _, dirs = spec.partition("=")
        pts = curve([Path(p) for p in dirs.split("+")])
        ax.plot([t / 60 for t, _ in pts], [v for _, v in pts], marker="o", label=label)
        print(f"{label}: " + ", ".join(f"{v:.3f} @ {t / 60:.1f} min" for t, v in pts))
    ax.set_xlabel("wall time (minutes) from the first validation")
    ax.set_ylabel("held-out reward (greedy)")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.set_title(args.title)
    ax.legend()
    fig.tight_layout()
    Path(args.png).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.png)
    print(f"wrote {args.png}")


if __name__ == "__main__":
    main()
