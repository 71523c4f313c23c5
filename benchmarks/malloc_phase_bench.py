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
        --init-from runs/recipe-calc_agent/seed-0/warm_start/checkpoints/step-000014

``--sft`` measures the warm start's path instead, without a run: the example's
demonstrations (its teacher through the real agent and gateway), a generation burst of
32 greedy rows (as a validation leaves the heap), then timed ``SFTBackend.step`` calls on
batches of ``warm_start.batch_size``; per mode: the burst's seconds, each step's seconds,
peak RSS (VmHWM).

    uv run python benchmarks/malloc_phase_bench.py examples/calc_agent/train.yaml --sft --steps 5

Run it on a quiet machine: the modes run one after another, and the load average is
printed beside each.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Per mode: BOLTRL_MALLOC_TUNING and the allocator setup the child runs first. ``static``
# sets the old settings before anything allocates much, with the package's own tuning off
# so that it does not override them.
STATIC = """
import ctypes, ctypes.util
libc = ctypes.CDLL(ctypes.util.find_library("c"))
assert libc.mallopt(-3, 128 * 1024) == 1 and libc.mallopt(-8, 4) == 1
"""
MODES = {"off": ("0", ""), "static": ("0", STATIC), "phase": ("1", "")}
CLI = """
import sys
from boltrl.cli import main
sys.exit(main(sys.argv[1:]))
"""

# ``--sft``: after the mode's allocator setup, this runs in the child.
SFT = """
import json, os, sys, time
import torch
from boltrl.loading import load_object
from boltrl.store import open_store
from boltrl_trainer.config import load_config
from boltrl_trainer.demonstrations import collect
from boltrl_trainer.malloc_tuning import tune_malloc
from boltrl_trainer.models import load_model
from boltrl_trainer.policy import apply_lora
from boltrl_trainer.sft import SFTBackend

config, steps = sys.argv[1], int(sys.argv[2])
tune_malloc()  # as Trainer.run and boltrl sft do (BOLTRL_MALLOC_TUNING=0: nothing)
torch.manual_seed(0)
cfg = load_config(config, [])
ws = cfg.warm_start
base, tok = load_model(cfg.model)
store = open_store("memory://")
try:
    items = collect(cfg, ws, agent=load_object(cfg.agent, what="agent"), tokenizer=tok,
                    store=store).transitions
finally:
    store.close()
model = apply_lora(base, cfg.lora)
pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
t0 = time.perf_counter()
with torch.no_grad():  # greedy, left-padded: what a validation leaves in the heap
    for k in range(0, 32, 16):
        rows = [items[i % len(items)].state for i in range(k, k + 16)]
        n = max(map(len, rows))
        ids = torch.tensor([[pad] * (n - len(r)) + list(r) for r in rows])
        starts = torch.tensor([n - len(r) for r in rows])
        attn = (torch.arange(n)[None, :] >= starts[:, None]).long()
        model.generate(input_ids=ids, attention_mask=attn, max_new_tokens=32,
                       do_sample=False, pad_token_id=pad)
burst = time.perf_counter() - t0
sft = SFTBackend(model, lr=ws.lr, pad_id=int(pad),
                 token_budget=ws.token_budget or cfg.optim.token_budget, share_prefix=True)
bs = ws.batch_size
times = []
for k in range(min(steps, len(items) // bs)):
    t0 = time.perf_counter()
    sft.step(items[k * bs : (k + 1) * bs])
    times.append(time.perf_counter() - t0)
peak = next(int(line.split()[1]) / 1024 for line in open("/proc/self/status")
            if line.startswith("VmHWM:"))
print("RESULT", json.dumps({"burst_s": burst, "step_s": times, "peak_mb": peak}))
"""


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def _run(mode: str, config: str, init_from: str, steps: int, sets: list[str], out: Path) -> dict:
    tuning, setup = MODES[mode]
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
            [sys.executable, "-c", setup + CLI, *argv],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
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


def _sft(mode: str, config: str, steps: int) -> dict[str, Any]:
    tuning, setup = MODES[mode]
    child = setup + SFT
    env = {**os.environ, "BOLTRL_MALLOC_TUNING": tuning}
    load_before = _load()
    out = subprocess.run(
        [sys.executable, "-c", child, config, str(steps)],
        env=env,
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        raise SystemExit(f"{mode}: the SFT child failed:\n{out.stderr[-3000:]}")
    line = next(x for x in out.stdout.splitlines() if x.startswith("RESULT "))
    return {"mode": mode, "load": f"{load_before} -> {_load()}", **json.loads(line[7:])}


def _sft_table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| mode | generation burst s | SFT step s | mean | peak MB | load average |",
        "|---|---:|---|---:|---:|---|",
    ]
    for r in results:
        steps = r["step_s"]
        lines.append(
            f"| {r['mode']} | {r['burst_s']:.1f} | {' / '.join(f'{x:.1f}' for x in steps)} | "
            f"{sum(steps) / max(len(steps), 1):.1f} | {r['peak_mb']:,.0f} | {r['load']} |"
        )
    return "\n".join(lines)


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
    p.add_argument("--init-from", default=None, help="checkpoint RL starts from")
    p.add_argument("--sft", action="store_true", help="time SFT steps instead of a run")
    p.add_argument("--steps", type=int, default=2, help="RL steps (with --sft: SFT steps)")
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    p.add_argument("--set", action="append", default=[], dest="sets", help="config override")
    p.add_argument("--out", default=None, help="folder for the runs (default: a temp dir)")
    args = p.parse_args(argv)
    if args.sft:
        rows = []
        for mode in args.modes:
            print(f"{mode}: SFT steps (load {_load()})", flush=True)
            rows.append(_sft(mode, args.config, args.steps))
            print(json.dumps(rows[-1]), flush=True)
        print(_sft_table(rows))
        return 0
    if args.init_from is None:
        p.error("--init-from is required (except with --sft)")
    root = Path(args.out or tempfile.mkdtemp(prefix="malloc-phase-"))
    root.mkdir(parents=True, exist_ok=True)
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
