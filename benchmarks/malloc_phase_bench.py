"""glibc malloc settings in a real training run: speed of generation, peak of the update.

Runs the same short ``boltrl train`` (RL only, from a checkpoint) once per mode, each in
a fresh child process, and prints wall time, the run's validations, rollouts and updates
(from its metrics.jsonl) and the child's peak RSS (``ru_maxrss``):

``off``     glibc's defaults (``BOLTRL_MALLOC_TUNING=0``): dynamic mmap threshold.
``static``  a static 128 KiB mmap threshold and 4 arenas for the whole run (what
            ``boltrl_trainer.malloc_tuning`` did before it switched by phase).
``phase``   today's default: 128 KiB only inside updates, glibc's dynamic ceiling
            (32 MiB) while generating, heaps trimmed on entering an update.

    uv run python benchmarks/malloc_phase_bench.py examples/calc_agent/train.yaml \\
        --init-from runs/recipe-calc-v2/seed-0/warm_start/checkpoints/step-000014

Run it on a quiet machine: the modes run one after another, and the load average is
printed beside each.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# ``static``: set the old settings before anything allocates much, with the package's own
# tuning off so that it does not override them.
STATIC = """
import ctypes, ctypes.util, sys
libc = ctypes.CDLL(ctypes.util.find_library("c"))
assert libc.mallopt(-3, 128 * 1024) == 1 and libc.mallopt(-8, 4) == 1
from boltrl.cli import main
sys.exit(main(sys.argv[1:]))
"""
PLAIN = """
import sys
from boltrl.cli import main
sys.exit(main(sys.argv[1:]))
"""
MODES = {"off": ("0", PLAIN), "static": ("0", STATIC), "phase": ("1", PLAIN)}


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def _run(mode: str, config: str, init_from: str, steps: int, sets: list[str], out: Path) -> dict:
    tuning, prelude = MODES[mode]
    argv = [
        "train", config, "--set", "warm_start=null", "--set", f"init_from={init_from}",
        "--set", f"steps={steps}", "--set", "progress=false", "--out", str(out),
    ]  # fmt: skip
    for s in sets:
        argv += ["--set", s]
    env = {**os.environ, "BOLTRL_MALLOC_TUNING": tuning}
    load_before = _load()
    t0 = time.perf_counter()
    with open(out.parent / f"{mode}.log", "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-c", prelude, *argv], env=env, stdout=log, stderr=subprocess.STDOUT
        )
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{mode}: boltrl train failed, see {out.parent / f'{mode}.log'}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps_rows = [r for r in rows if "time/rollout_s" in r]
    vals = [r for r in rows if "val/reward_mean" in r]
    # The first validation's elapsed time includes loading; the last one is the gap from
    # the last step's end.
    last_val_s = vals[-1]["time/elapsed_s"] - steps_rows[-1]["time/elapsed_s"]
    return {
        "mode": mode,
        "wall_s": wall,
        "peak_mb": usage.ru_maxrss / 1024,
        "load": f"{load_before} -> {_load()}",
        "first_val_s": vals[0]["time/elapsed_s"],
        "last_val_s": last_val_s,
        "rollout_s": [r["time/rollout_s"] for r in steps_rows],
        "update_s": [r["time/update_s"] for r in steps_rows],
        "val": [round(v["val/reward_mean"], 3) for v in vals],
    }


def _table(results: list[dict[str, Any]]) -> str:
    def secs(xs: list[float]) -> str:
        return " / ".join(f"{x:.1f}" for x in xs)

    lines = [
        "| mode | wall | load + first validation s | last validation s | rollout s"
        " | update s | peak MB | val reward | load average |",
        "|---|---:|---:|---:|---|---|---:|---|---|",
    ]
    for r in results:
        m, s = divmod(round(r["wall_s"]), 60)
        lines.append(
            f"| {r['mode']} | {m} min {s} s | {r['first_val_s']:.1f} | {r['last_val_s']:.1f} | "
            f"{secs(r['rollout_s'])} | {secs(r['update_s'])} | {r['peak_mb']:,.0f} | "
            f"{' -> '.join(str(v) for v in r['val'])} | {r['load']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("config")
    p.add_argument("--init-from", required=True, help="checkpoint RL starts from")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    p.add_argument("--set", action="append", default=[], dest="sets", help="config override")
    p.add_argument("--out", default=None, help="folder for the runs (default: a temp dir)")
    args = p.parse_args(argv)
    if resource.getrlimit(resource.RLIMIT_AS)[0] != resource.RLIM_INFINITY:
        print("note: an address-space limit is set; peaks may be capped", file=sys.stderr)
    root = Path(args.out or tempfile.mkdtemp(prefix="malloc-phase-"))
    results = []
    for mode in args.modes:
        print(f"{mode}: running (load {_load()})", flush=True)
        r = _run(mode, args.config, args.init_from, args.steps, args.sets, root / mode)
        print(json.dumps(r), flush=True)
        results.append(r)
    print(_table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
