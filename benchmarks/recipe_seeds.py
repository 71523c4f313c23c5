"""An example's whole recipe (warm start, then RL) over several seeds: held-out reward of the
base model, after the warm start and after RL, mean ± std, wall time, load average, and a
learning-curve PNG (held-out reward against wall time, one line per seed).

Runs the real CLI (`boltrl train CONFIG`) once per seed, sequentially (the machine has 2
cores), and reads each run's metrics files, so the figures are what a user's run shows:
the warm start's `warm_start/metrics.jsonl` holds the base model's validation (step 0)
and the run's `metrics.jsonl` holds validation after the warm start (step 0) and after RL.

    uv run python benchmarks/recipe_seeds.py examples/calc_agent/train.yaml --seeds 0 1 2
    uv run python benchmarks/recipe_seeds.py examples/calc_agent/train.yaml --set steps=0

Prints one markdown table row per seed and a summary row; `--png` writes the curve.
`--test` also evaluates each seed's warm-start and final checkpoints on the config's test
split (greedy `boltrl eval --checkpoint`, after the seed's recipe: not in its wall) and
prints a second table; `--test-only` does that for the runs already in `--out`, and
`--test-limit N` evaluates the first N test tasks only. `--merge A/results.json
B/results.json ...` prints the tables (and `--png` the curve) of seeds run by separate
invocations, from their results files, without running anything:

    uv run python benchmarks/recipe_seeds.py examples/dspy_program/train.yaml \
        --merge runs/a/results.json runs/b/results.json --png curve.png
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def _rows(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _val(rows: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """(unix time, val reward) of each validation row."""
    return [(r["time"], r["val/reward_mean"]) for r in rows if "val/reward_mean" in r]


def run(
    config: str, seed: int, out: Path, extra: list[str], log: Path, base: float | None = None
) -> dict[str, Any]:
    """One seed's recipe. ``base``: the base model's held-out reward measured by an earlier
    seed; then this run skips that validation (greedy decoding of the same base model on
    the same tasks gives the same figure for every seed)."""
    if base is not None:
        extra = [*extra, "--set", "warm_start.validate_before=false"]
    cmd = [
        sys.executable,
        "-m",
        "boltrl.cli",
        "train",
        config,
        "--set",
        f"seed={seed}",
        "--set",
        f"out_dir={out.resolve()}",
        "--set",
        "progress=false",
        *extra,
    ]
    load0 = os.getloadavg()[0]
    t0 = time.time()
    with log.open("w") as fh:
        proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, text=True)
    wall = time.time() - t0
    load1 = os.getloadavg()[0]
    if proc.returncode != 0:
        raise SystemExit(f"seed {seed} failed (exit {proc.returncode}); see {log}")
    ws = _val(_rows(out / "warm_start" / "metrics.jsonl"))
    rows = _rows(out / "metrics.jsonl")
    rl = _val(rows)
    warm_started = bool(ws) or base is not None
    res: dict[str, Any] = {
        "seed": seed,
        "base": base if base is not None else ws[0][1] if ws else (rl[0][1] if rl else None),
        "warm": rl[0][1] if warm_started and rl else None,
        "rl": rl[-1][1] if rl else None,
        "groups": _step_sum(rows, "train/trained_groups"),
        "shaping": _step_sum(rows, "train/shaping_only_groups"),
        "wall_s": wall,
        "load": (load0, load1),
        "curve": [(t - t0, v) for t, v in ws[:1] + rl],
    }
    return res


def _step_sum(rows: list[dict[str, Any]], key: str) -> float | None:
    """A step metric summed over the run's RL steps; None for a run written before the
    trainer logged it. ``train/trained_groups``: groups with mixed returns the steps trained
    on, how much signal the run had (a group of equal returns teaches GRPO nothing);
    ``train/shaping_only_groups``: those of them whose final rewards were all equal, set
    apart by intermediate rewards alone."""
    steps = [r for r in rows if "train/reward_mean" in r]
    if any(key not in r for r in steps):
        return None
    return float(sum(r[key] for r in steps))


def _last_checkpoint(folder: Path) -> Path | None:
    steps = sorted(folder.glob("step-*"))
    return steps[-1] if steps else None


def eval_test_split(
    config: str, out: Path, extra: list[str], limit: int | None = None
) -> dict[str, Any]:
    """Greedy test-split reward of a finished seed's warm-start and final checkpoints,
    through the real CLI (`boltrl eval --checkpoint`); each eval's report is kept beside
    the run. Held out like val, and never seen by a teacher or a training step. ``limit``:
    the first that many test tasks only (`boltrl eval --limit`)."""
    res: dict[str, Any] = {}
    for key, ck in (
        ("warm", _last_checkpoint(out / "warm_start" / "checkpoints")),
        ("rl", _last_checkpoint(out / "checkpoints")),
    ):
        if ck is None:
            res[key] = None
            continue
        report = out / f"test-{key}.json"
        cmd = [sys.executable, "-m", "boltrl.cli", "eval", config, "--split", "test"]
        cmd += ["--checkpoint", str(ck), "--per-task", "0", "--report", str(report), *extra]
        if limit is not None:
            cmd += ["--limit", str(limit)]
        with (out / f"test-{key}.log").open("w") as fh:
            proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"test eval of {ck} failed (exit {proc.returncode})")
        res[key] = json.loads(report.read_text())["splits"]["test"]["mean"]
    return res


def print_test(rows: list[tuple[int, dict[str, Any]]]) -> None:
    print("\n| seed | test after warm start | test after RL | RL gain on test |")
    print("|---:|---:|---:|---:|")
    gains = []
    for seed, t in rows:
        gain = None if t["warm"] is None or t["rl"] is None else t["rl"] - t["warm"]
        if gain is not None:
            gains.append(gain)
        shown = "n/a" if gain is None else f"{gain:+.3f}"
        print(f"| {seed} | {_fmt(t['warm'])} | {_fmt(t['rl'])} | {shown} |")
    warm = [t["warm"] for _, t in rows if t["warm"] is not None]
    rl = [t["rl"] for _, t in rows if t["rl"] is not None]
    print(f"| mean ± std | {_ms(warm)} | {_ms(rl)} | {_ms(gains, signed=True)} |", flush=True)


TABLE_HEADER = (
    "| seed | base | after warm start | after RL | RL gain | groups trained (shaping only) "
    "| wall (s) | load avg |\n|---:|---:|---:|---:|---:|---:|---:|---|"
)


def print_row(r: dict[str, Any]) -> None:
    gain = None if r["rl"] is None or r["warm"] is None else r["rl"] - r["warm"]
    print(
        f"| {r['seed']} | {_fmt(r['base'])} | {_fmt(r['warm'])} | {_fmt(r['rl'])} | "
        f"{'n/a' if gain is None else f'{gain:+.3f}'} | {_groups(r)} | "
        f"{r['wall_s']:.0f} | "
        f"{r['load'][0]:.1f} → {r['load'][1]:.1f} |",
        flush=True,
    )


def print_summary(results: list[dict[str, Any]]) -> None:
    def col(k: str) -> list[float]:
        return [r[k] for r in results if r.get(k) is not None]

    gains = [r["rl"] - r["warm"] for r in results if r["rl"] is not None and r["warm"] is not None]
    print(
        f"| mean ± std | {_ms(col('base'))} | {_ms(col('warm'))} | {_ms(col('rl'))} | "
        f"{_ms(gains, signed=True)} | {_count(_mean(col('groups')))}"
        f"{_paren(_count(_mean(col('shaping'))))} | "
        f"{statistics.mean(col('wall_s')):.0f} | |"
    )


def merge_results(paths: list[Path]) -> list[dict[str, Any]]:
    """The seeds of several runs' ``results.json`` files, by seed. A seed in two files is
    an error naming both: the files would disagree on which run the table shows."""
    where: dict[int, Path] = {}
    merged: list[dict[str, Any]] = []
    for path in paths:
        try:
            rows = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise SystemExit(f"--merge: cannot read {path}: {e}") from None
        if not isinstance(rows, list) or not all(isinstance(r, dict) and "seed" in r for r in rows):
            raise SystemExit(f"--merge: {path} is not a recipe_seeds results file (seeds)")
        for r in rows:
            seed = r["seed"]
            if seed in where:
                raise SystemExit(f"--merge: seed {seed} is in both {where[seed]} and {path}")
            where[seed] = path
            merged.append(r)
    return sorted(merged, key=lambda r: int(r["seed"]))


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def _groups(r: dict[str, Any]) -> str:
    """Groups trained, and in brackets those set apart by intermediate rewards alone
    ("16 (3)"; no brackets for results written before the trainer logged them)."""
    return _count(r["groups"]) + _paren(_count(r.get("shaping")))


def _paren(text: str) -> str:
    return "" if text == "n/a" else f" ({text})"


def _count(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.0f}"


def _mean(xs: list[float]) -> float | None:
    return statistics.mean(xs) if xs else None


def _ms(xs: list[float], signed: bool = False) -> str:
    """Mean ± std (n - 1); ``signed``: a gain, printed with its sign as the seed rows are."""
    if not xs:
        return "n/a"
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return f"{statistics.mean(xs):{'+' if signed else ''}.3f} ± {sd:.3f}"


def plot(results: list[dict[str, Any]], png: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    for r in results:
        xs = [t / 60 for t, _ in r["curve"]]
        ys = [v for _, v in r["curve"]]
        ax.plot(xs, ys, marker="o", label=f"seed {r['seed']}")
    ax.set_xlabel("wall time (minutes): base, after warm start, during/after RL")
    ax.set_ylabel("held-out reward (greedy)")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("config")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--out", default=None, help="default runs/recipe-<example>")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--png", default=None, help="write the learning curve here")
    ap.add_argument(
        "--base-once",
        action="store_true",
        help="validate the base model in the first seed only (greedy: the same for every seed)",
    )
    ap.add_argument(
        "--base",
        type=float,
        default=None,
        help="the base model's held-out reward measured by an earlier run with the same "
        "val settings; every seed then skips that validation",
    )
    ap.add_argument("--test", action="store_true", help="also evaluate on the test split")
    ap.add_argument(
        "--test-limit",
        type=int,
        default=None,
        help="evaluate the first N test tasks only (the validations' size, say)",
    )
    ap.add_argument(
        "--test-only",
        action="store_true",
        help="only evaluate the runs already in --out on the test split",
    )
    ap.add_argument(
        "--merge",
        nargs="+",
        type=Path,
        default=None,
        metavar="RESULTS",
        help="print the tables (and --png the curve) of earlier runs' results.json files "
        "together, without running anything",
    )
    args = ap.parse_args()
    name = Path(args.config).resolve().parent.name
    if args.merge:
        merged = merge_results(args.merge)
        print(TABLE_HEADER)
        for r in merged:
            print_row(r)
        print_summary(merged)
        if all(r.get("test") for r in merged):
            print_test([(r["seed"], r["test"]) for r in merged])
        if args.png:
            plot(merged, Path(args.png), f"{name}: warm start then RL ({len(merged)} seeds)")
            print(f"plot: {args.png}")
        return
    out = Path(args.out or f"runs/recipe-{name}")
    out.mkdir(parents=True, exist_ok=True)
    extra = [x for o in args.overrides for x in ("--set", o)]

    def test_split(seeds: list[int]) -> list[tuple[int, dict[str, Any]]]:
        tests = [
            (s, eval_test_split(args.config, out / f"seed-{s}", extra, args.test_limit))
            for s in seeds
        ]
        print_test(tests)
        return tests

    if args.test_only:
        test_split(args.seeds)
        return
    print(TABLE_HEADER)
    results: list[dict[str, Any]] = []
    for s in args.seeds:
        base = results[0]["base"] if args.base_once and results else args.base
        r = run(args.config, s, out / f"seed-{s}", extra, out / f"seed-{s}.log", base)
        results.append(r)
        print_row(r)
    print_summary(results)
    if args.test:
        tests = test_split([r["seed"] for r in results])
        for (_, t), r in zip(tests, results, strict=True):
            r["test"] = t
    (out / "results.json").write_text(json.dumps(results, indent=1))
    if args.png:
        plot(results, Path(args.png), f"{name}: warm start then RL ({len(results)} seeds)")
        print(f"plot: {args.png}")


if __name__ == "__main__":
    main()
