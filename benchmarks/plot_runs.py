"""Held-out reward against wall time for finished runs, read from their metrics files.

Each ``--run LABEL=DIR`` is one line: the validations of ``DIR/warm_start/metrics.jsonl``
(the base model, when the warm start validated it) then of ``DIR/metrics.jsonl`` (after
the warm start, during and after RL). ``LABEL=DIR1+DIR2`` chains a recipe that ran as two
processes — a warm start, then RL from its checkpoint with ``init_from`` — the second's
first validation (the same greedy model) joined to the first's last, so the line reads as
one run without the time between the two.

``--x step`` plots against the RL step instead (``DIR/metrics.jsonl`` only, the phase that
starts from the warm start at step 0), with the mean over the runs at the steps they all
validated; a run continued with ``--resume`` is then one line, whatever time passed
between its two processes.

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


def by_step(dirs: list[Path]) -> list[tuple[float, float]]:
    """(RL step, reward) of the validations in ``DIR/metrics.jsonl`` over the run folders
    (the last row wins where a step repeats)."""
    points: dict[int, float] = {}
    for d in dirs:
        path = d / "metrics.jsonl"
        if not path.is_file():
            raise SystemExit(f"{d}: no metrics.jsonl")
        for line in path.read_text().splitlines():
            row = json.loads(line) if line.strip() else {}
            if "val/reward_mean" in row:
                points[int(row["step"])] = float(row["val/reward_mean"])
    if not points:
        raise SystemExit(f"{'+'.join(map(str, dirs))}: no validation rows")
    return sorted((float(k), v) for k, v in points.items())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--run", action="append", required=True, help="LABEL=DIR[+DIR...]")
    ap.add_argument("--png", required=True)
    ap.add_argument("--title", default="held-out reward")
    ap.add_argument("--x", choices=["time", "step"], default="time", help="the x axis")
    args = ap.parse_args()

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    lines: list[dict[float, float]] = []
    for spec in args.run:
        label, _, dirs = spec.partition("=")
        paths = [Path(p) for p in dirs.split("+")]
        if args.x == "step":
            pts = by_step(paths)
            ax.plot([s for s, _ in pts], [v for _, v in pts], marker="o", alpha=0.6, label=label)
            print(f"{label}: " + ", ".join(f"{v:.3f} @ step {s:.0f}" for s, v in pts))
            lines.append(dict(pts))
        else:
            pts = curve(paths)
            ax.plot([t / 60 for t, _ in pts], [v for _, v in pts], marker="o", label=label)
            print(f"{label}: " + ", ".join(f"{v:.3f} @ {t / 60:.1f} min" for t, v in pts))
    if len(lines) > 1:
        steps = sorted(set.intersection(*(set(x) for x in lines)))
        mean = [sum(x[s] for x in lines) / len(lines) for s in steps]
        ax.plot(steps, mean, color="black", linewidth=2.5, label=f"mean of {len(lines)}")
        shown = ", ".join(f"{v:.3f} @ step {s:.0f}" for s, v in zip(steps, mean, strict=True))
        print(f"mean: {shown}")
    if args.x == "step":
        ax.set_xlabel("RL step (0: after the warm start)")
    else:
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
