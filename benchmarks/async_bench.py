"""Async vs synchronous ``boltrl train`` on the demo task, side by side in one run.

Both arms train the demo setup (SmolLM2-135M-Instruct, LoRA, GRPO, 8 tasks x 8 samples
per step; ``boltrl_trainer.demo``) from the same seed for the same steps, one after the
other in this process: first the synchronous loop (rollouts, then the update with
generation paused), then ``async: {max_staleness: K}`` (the next step's rollouts run
while the update trains a copy of the weights). For each arm it reports

  steps per minute     over the training span (end of the step-0 validation to the
                       last step's end; the later validations are inside it in both arms)
  held-out reward      greedy, on the first --limit-val validation problems, against the
                       wall time at which it was measured
  where time goes      per step: generation (the backend serving at least one call),
                       update (forward/backward/AdamW; async: + proximal logprobs),
                       overlap (generation while the update ran), swap (generation
                       paused to copy weights in), waiting for rollouts, the rest

and, from the synchronous arm's split, the step time to expect when generation and the
update run on separate devices (the GPU setting: max(generation, update) + the rest).

    OMP_NUM_THREADS=1 uv run python benchmarks/async_bench.py \\
        --png benchmarks/async_bench.png
    uv run python benchmarks/async_bench.py --quick      # tiny model, a minute: a smoke test
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def run_arm(name: str, data: dict[str, Any], out: Path) -> dict[str, Any]:
    from boltrl_trainer.cli_report import ConsoleReporter
    from boltrl_trainer.config import load_config
    from boltrl_trainer.trainer import Trainer

    cfg = load_config(data={**data, "out_dir": str(out / name)})
    t0 = time.perf_counter()
    Trainer(cfg, run_name=f"async-bench-{name}", reporter=ConsoleReporter(progress=False)).run()
    wall = time.perf_counter() - t0
    rows = [json.loads(x) for x in (out / name / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "update/loss" in r or "update/skipped" in r]
    vals = [r for r in rows if "val/reward_mean" in r]
    start = vals[0]["time/elapsed_s"] if vals and vals[0]["step"] == 0 else 0.0
    span = steps[-1]["time/elapsed_s"] - start

    def per_step(key: str) -> float:
        return statistics.mean(float(r.get(key, 0.0)) for r in steps)

    return {
        "arm": name,
        "steps": len(steps),
        "wall_s": wall,
        "span_s": span,
        "steps_per_min": 60.0 * len(steps) / span,
        "step_s_median": statistics.median(r["time/step_s"] for r in steps),
        "generation_s": per_step("time/generation_s"),
        "update_s": per_step("time/update_s"),
        "proximal_s": per_step("time/proximal_s"),
        "overlap_s": per_step("time/overlap_s"),
        "swap_s": per_step("time/swap_s"),
        "wait_s": per_step("time/wait_rollouts_s"),
        "step_s": per_step("time/step_s"),
        "train_reward": [r["train/reward_mean"] for r in steps],
        "staleness_mean": per_step("offpolicy/staleness_mean"),
        "dropped": sum(r.get("offpolicy/dropped", 0.0) for r in steps),
        "is_weight_std": per_step("offpolicy/is_weight_std"),
        "truncated_frac": per_step("offpolicy/truncated_frac"),
        "val": [(r["step"], r["time/elapsed_s"] - start, r["val/reward_mean"]) for r in vals],
    }


def table(res: list[dict[str, Any]]) -> str:
    lines = [
        "| arm | steps/min | s/step | generation | update (proximal) | overlap | swap "
        "| wait for rollouts | held-out reward (step: value @ s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in res:
        val = ", ".join(f"{s}: {v:.3f} @ {t:.0f}s" for s, t, v in r["val"])
        lines.append(
            f"| {r['arm']} | {r['steps_per_min']:.2f} | {r['step_s']:.1f} "
            f"| {r['generation_s']:.1f} | {r['update_s']:.1f} ({r['proximal_s']:.1f}) "
            f"| {r['overlap_s']:.1f} | {r['swap_s']:.2f} | {r['wait_s']:.1f} | {val} |"
        )
    return "\n".join(lines)


def on_paper(sync: dict[str, Any], asyn: dict[str, Any]) -> str:
    g, u, step = sync["generation_s"], sync["update_s"], sync["step_s"]
    rest = max(step - g - u, 0.0)
    # separate devices: the two phases no longer share compute, the step is the longer one
    ideal = max(g, u) + rest + asyn["swap_s"]
    return (
        f"sync step {step:.1f}s = generation {g:.1f} + update {u:.1f} + rest {rest:.1f}; "
        f"on separate devices: max({g:.1f}, {u:.1f}) + {rest:.1f} + swap {asyn['swap_s']:.2f}"
        f" = {ideal:.1f}s -> {step / ideal:.2f}x the synchronous steps per minute"
    )


def plot(res: list[dict[str, Any]], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for r in res:
        ts = [t for _, t, _ in r["val"]]
        vs = [v for _, _, v in r["val"]]
        ax1.plot(ts, vs, marker="o", label=f"{r['arm']} ({r['steps_per_min']:.2f} steps/min)")
        for s, t, v in r["val"]:
            ax1.annotate(f"step {s}", (t, v), textcoords="offset points", xytext=(4, 4))
    ax1.set_xlabel("wall time since training started (s)")
    ax1.set_ylabel("held-out reward (greedy)")
    ax1.set_title("held-out reward against wall time")
    ax1.legend()
    names = [r["arm"] for r in res]
    gen = [r["generation_s"] for r in res]
    upd = [r["update_s"] for r in res]
    ovl = [r["overlap_s"] for r in res]
    step = [r["step_s"] for r in res]
    x = range(len(res))
    ax2.bar(x, gen, 0.35, label="generation")
    ax2.bar([i + 0.35 for i in x], upd, 0.35, label="update")
    ax2.bar([i + 0.35 for i in x], ovl, 0.35, label="generating during the update", alpha=0.6)
    ax2.scatter([i + 0.175 for i in x], step, color="k", zorder=3, label="step wall time")
    ax2.set_xticks([i + 0.175 for i in x], names)
    ax2.set_ylabel("seconds per step (mean)")
    ax2.set_title("where a step's time goes")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--val-every", type=int, default=3)
    ap.add_argument("--limit-val", type=int, default=32)
    ap.add_argument("--max-staleness", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="tiny model, 3 small steps")
    ap.add_argument("--out", default=None, help="run folder (default: a temp dir)")
    ap.add_argument("--png", default=None)
    ap.add_argument("--json", default=None, help="write the figures here")
    args = ap.parse_args()

    from boltrl_trainer.demo import DEMO_CONFIG
    from boltrl_trainer.models import tiny_model

    data: dict[str, Any] = {
        **DEMO_CONFIG,
        "steps": args.steps,
        "val_every": args.val_every,
        "progress": False,
        "report_to": ["jsonl"],
        "seed": 0,
    }
    data["tasks"] = {**DEMO_CONFIG["tasks"], "limit_val": args.limit_val}
    if args.quick:
        data.update(
            model=str(tiny_model()),
            steps=3,
            batch_tasks=2,
            group_size=3,
            concurrency=6,
            max_tokens=6,
            lora={"r": 4, "alpha": 8},
            val_every=2,
        )
        data["tasks"] = {**data["tasks"], "limit_val": 4}
    out = Path(args.out or tempfile.mkdtemp(prefix="boltrl-async-bench-"))
    print(f"load average before: {_load()}; OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}")
    res = [run_arm("sync", data, out)]
    res.append(run_arm("async", {**data, "async": {"max_staleness": args.max_staleness}}, out))
    print(f"load average after: {_load()}")
    print()
    print(table(res))
    print()
    print(on_paper(res[0], res[1]))
    a = res[1]
    print(
        f"async: staleness mean {a['staleness_mean']:.2f}, dropped {a['dropped']:.0f}, "
        f"IS weight std {a['is_weight_std']:.4f}, truncated {a['truncated_frac']:.4f}; "
        f"speed-up {a['steps_per_min'] / res[0]['steps_per_min']:.2f}x steps/min"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
    if args.png:
        plot(res, Path(args.png))
        print(f"plot: {args.png}")


if __name__ == "__main__":
    main()
