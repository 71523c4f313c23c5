"""Where `boltrl demo`'s resident memory goes, phase by phase.

Runs the real demo (``DEMO_CONFIG`` through ``Trainer``: store, 64 runner threads with
their OpenAI clients, gateway, SmolLM2-135M + LoRA, updates) for a few steps and
reports, per phase, the resident set at its start, its peak (VmHWM) and at its end:

  load         model + tokenizer load, LoRA, the server and the training backend
  validation   held-out generation at temperature 0 (64 rows at once)
  generation   a step's training rollouts (batch_tasks x group_size rows at once)
  update       forward/backward/AdamW over the step's transitions

The peak is reset at each phase's start by writing ``5`` to ``/proc/self/clear_refs``
(Linux), so each phase's figure is its own high-water mark. ``--convert`` first
measures the one-time GGUF -> safetensors conversion in a child process with an empty
cache folder.

    uv run python benchmarks/memory_bench.py                       # the demo's defaults
    uv run python benchmarks/memory_bench.py --set optim.token_budget=4096
    BOLTRL_MALLOC_TUNING=0 uv run python benchmarks/memory_bench.py   # glibc's defaults
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _status() -> dict[str, float]:
    """VmRSS and VmHWM of this process in MB."""
    out: dict[str, float] = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                key, value = line.split(":")
                out[key] = int(value.split()[0]) / 1024
    return out


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


class Phases:
    """Records (phase, seconds, RSS at start, peak, RSS at end) around wrapped calls."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def wrap(self, owner: Any, attr: str, name: Callable[..., str]) -> None:
        inner = getattr(owner, attr)

        def measured(*args: Any, **kwargs: Any) -> Any:
            _reset_peak()
            start, t0 = _status()["VmRSS"], time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                end = _status()
                self.rows.append(
                    {
                        "phase": name(*args, **kwargs),
                        "seconds": time.perf_counter() - t0,
                        "rss_start_mb": start,
                        "peak_mb": end["VmHWM"],
                        "rss_end_mb": end["VmRSS"],
                    }
                )
                print(f"  {self.rows[-1]}", flush=True)

        setattr(owner, attr, measured)


_CONVERT = """
import json, sys
from boltrl_trainer.models import resolve_model
resolve_model("smollm2")
for line in open("/proc/self/status"):
    if line.startswith("VmHWM:"):
        print(json.dumps({"peak_mb": int(line.split()[1]) / 1024}))
"""


def convert_peak() -> dict[str, Any]:
    """Peak RSS of converting the default GGUF file into an empty cache (child process)."""
    with tempfile.TemporaryDirectory(prefix="boltrl-mem-cache-") as cache:
        t0 = time.perf_counter()
        out = subprocess.run(
            [sys.executable, "-c", _CONVERT],
            env={**os.environ, "BOLTRL_CACHE": cache},
            capture_output=True,
            text=True,
            check=True,
        )
        row = json.loads(out.stdout.strip().splitlines()[-1])
    return {
        "phase": "GGUF conversion (once, own process)",
        "seconds": time.perf_counter() - t0,
        "rss_start_mb": None,
        "rss_end_mb": None,
        **row,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--val", type=int, default=64, help="validation tasks (0: none)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--convert", action="store_true", help="also measure the GGUF conversion")
    ap.add_argument("--convert-only", action="store_true", help="only the GGUF conversion")
    ap.add_argument("--json", type=Path, help="write the rows to this file")
    args = ap.parse_args()

    from boltrl_trainer import backends, session, update
    from boltrl_trainer.config import load_config
    from boltrl_trainer.demo import DEMO_CONFIG
    from boltrl_trainer.trainer import Trainer

    rows: list[dict[str, Any]] = []
    load0 = os.getloadavg()
    if args.convert or args.convert_only:
        rows.append(convert_peak())
        print(f"  {rows[-1]}", flush=True)
        if args.convert_only:
            return 0
    phases = Phases()
    phases.wrap(backends.TorchBackend, "build", lambda *a, **k: "load")
    phases.wrap(
        session.RolloutSession,
        "run",
        lambda self, tasks, sampling, label: (
            "validation" if label.startswith("val") else "generation"
        ),
    )
    phases.wrap(update.TorchTrainingBackend, "update", lambda *a, **k: "update")

    out = Path(tempfile.mkdtemp(prefix="boltrl-mem-bench-"))
    overrides = [
        f"steps={args.steps}",
        f"out_dir={out}",
        "progress=false",
        "val_every=0",
        f"tasks.limit_val={max(args.val, 1)}",
        *args.overrides,
    ]
    data = dict(DEMO_CONFIG)
    if args.val == 0:
        data["tasks"] = {"train": DEMO_CONFIG["tasks"]["train"]}
    cfg = load_config(None, overrides, data=data)
    start = _status()["VmRSS"]
    t0 = time.perf_counter()
    Trainer(cfg, run_name="memory-bench").run()
    rows.extend(phases.rows)
    load1 = os.getloadavg()

    print(
        f"\nboltrl demo, {args.steps} steps, token_budget {cfg.optim.token_budget}, "
        f"concurrency {cfg.concurrency}, {time.perf_counter() - t0:.0f} s; interpreter "
        f"with imports {start:.0f} MB before loading; load average {load0[0]:.1f} -> "
        f"{load1[0]:.1f}; BOLTRL_MALLOC_TUNING={os.environ.get('BOLTRL_MALLOC_TUNING', '')!r}\n"
    )
    print("| phase | s | RSS at start MB | peak MB | RSS at end MB |\n|---|---:|---:|---:|---:|")
    for r in rows:
        s, e = r["rss_start_mb"], r["rss_end_mb"]
        print(
            f"| {r['phase']} | {r['seconds']:.1f} | {'—' if s is None else f'{s:,.0f}'} | "
            f"{r['peak_mb']:,.0f} | {'—' if e is None else f'{e:,.0f}'} |"
        )
    print(f"\npeak over all phases: {max(r['peak_mb'] for r in rows):,.0f} MB")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "load": [load0, load1]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
