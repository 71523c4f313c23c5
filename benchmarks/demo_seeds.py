"""`boltrl demo` over several seeds: held-out reward before and after, mean ± std.

Runs the real CLI once per seed (sequentially: the machine has 2 cores) and reads each
run's metrics.jsonl, so the figures are exactly what a user's `uv run boltrl demo` shows.

    uv run python benchmarks/demo_seeds.py --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path


def run(seed: int, out: Path, extra: list[str]) -> dict[str, float]:
    t0 = time.perf_counter()
    cmd = [
        sys.executable,
        "-m",
        "boltrl.cli",
        "demo",
        "--seed",
        str(seed),
        "--out",
        str(out),
        "--set",
        "progress=false",
        *extra,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"seed {seed} failed:\n{proc.stderr[-3000:]}")
    wall = time.perf_counter() - t0
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    val = [r for r in rows if "val/reward_mean" in r]
    steps = [r for r in rows if "time/step_s" in r]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("val reward:"))
    print(f"seed {seed}: {line}  ({wall:.0f}s, {len(steps)} steps)", flush=True)
    return {
        "before": val[0]["val/reward_mean"],
        "after": val[-1]["val/reward_mean"],
        "wall_s": wall,
        "step_s": statistics.median(r["time/step_s"] for r in steps),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--out", default="runs/demo-seeds")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    args = ap.parse_args()
    extra = [x for o in args.overrides for x in ("--set", o)]
    res = [run(s, Path(args.out) / f"seed-{s}", extra) for s in args.seeds]

    def ms(key: str) -> str:
        xs = [r[key] for r in res]
        sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
        return f"{statistics.mean(xs):.3f} ± {sd:.3f}"

    gains = [r["after"] - r["before"] for r in res]
    print(
        f"\n{len(res)} seeds: val reward before {ms('before')} -> after {ms('after')}; "
        f"gain {statistics.mean(gains):+.3f} (min {min(gains):+.3f}); "
        f"median step {statistics.median(r['step_s'] for r in res):.1f}s, "
        f"run {statistics.mean(r['wall_s'] for r in res):.0f}s on average"
    )


if __name__ == "__main__":
    main()
