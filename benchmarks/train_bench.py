"""Where a training step's wall time goes: generation, update, framework overhead.

Runs a few steps of the demo setup (SmolLM2-135M-Instruct, LoRA, CPU) through the real
``Trainer`` and splits each step's wall time into
  generation  time during which the backend was serving at least one model call,
  update      forward/backward/optimizer of the policy update,
  overhead    everything else: store, gateway HTTP, runners, agents, credit assignment,
              advantages, batching and weight publication.
The first step is reported but left out of the medians (it pays one-time warm-up).

    uv run python benchmarks/train_bench.py --steps 4
    uv run python benchmarks/train_bench.py --model tiny --steps 6   # quick, tiny model
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--model", default="smollm2", help="smollm2, tiny, or a path")
    ap.add_argument("--batch-tasks", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--out", default=None, help="run folder (default: a temp dir)")
    args = ap.parse_args()

    from boltrl_trainer.cli_report import ConsoleReporter
    from boltrl_trainer.config import load_config
    from boltrl_trainer.demo import DEMO_CONFIG
    from boltrl_trainer.models import tiny_model
    from boltrl_trainer.trainer import Trainer

    model = str(tiny_model()) if args.model == "tiny" else args.model
    out = Path(args.out or tempfile.mkdtemp(prefix="boltrl-train-bench-"))
    data = {
        **DEMO_CONFIG,
        "model": model,
        "steps": args.steps,
        "batch_tasks": args.batch_tasks,
        "group_size": args.group_size,
        "concurrency": args.batch_tasks * args.group_size,
        "tasks": {"train": DEMO_CONFIG["tasks"]["train"]},  # no validation: steps only
        "out_dir": str(out),
        "progress": False,
    }
    print(f"load average at the start {os.getloadavg()[0]:.2f}", flush=True)
    t0 = time.perf_counter()
    reporter = ConsoleReporter(progress=False)  # the per-step lines, as boltrl train prints
    Trainer(load_config(data=data), run_name="train-bench", reporter=reporter).run()
    total = time.perf_counter() - t0
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "time/step_s" in r]

    print(
        f"\nmodel {args.model}, {args.batch_tasks} tasks x {args.group_size} samples per step, "
        f"{len(steps)} steps, {total:.0f}s in all (model load included)\n"
    )
    print(
        f"{'step':>4} {'wall s':>8} {'generation':>11} {'tokens/s':>9} {'update':>8} "
        f"{'overhead':>9} {'overhead %':>10}"
    )
    total_tokens = 0
    for r in steps:
        s = r["time/step_s"]
        tokens = r["throughput/completion_tokens_total"] - total_tokens  # this step's
        total_tokens = r["throughput/completion_tokens_total"]
        r["generated_tokens_per_s"] = tokens / max(r["time/generation_s"], 1e-9)
        print(
            f"{r['step']:>4} {s:>8.2f} {r['time/generation_s']:>11.2f} "
            f"{r['generated_tokens_per_s']:>9.1f} {r['time/update_s']:>8.2f} "
            f"{r['time/overhead_s']:>9.2f} {100 * r['time/overhead_s'] / s:>9.1f}%"
        )
    rest = steps[1:] or steps
    med = {
        k: statistics.median(r[k] for r in rest)
        for k in ("time/step_s", "time/generation_s", "time/update_s", "time/overhead_s")
    }
    tps = statistics.median(r["generated_tokens_per_s"] for r in rest)
    print(
        f"\nmedian (steps 2+): {tps:.1f} generated tokens/s; step {med['time/step_s']:.2f}s = "
        f"generation "
        f"{med['time/generation_s']:.2f}s + update {med['time/update_s']:.2f}s + overhead "
        f"{med['time/overhead_s']:.2f}s ({100 * med['time/overhead_s'] / med['time/step_s']:.1f}%)"
    )
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
