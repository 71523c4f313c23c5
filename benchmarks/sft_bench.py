"""The warm start's SFT step: rows packed by shared prompt prefix against by length alone.

Collects an example's demonstrations exactly as its warm start does (the example's
teacher playing the model through the real agent and gateway, rendered in the student's
tokens), then times ``SFTBackend.step`` on the same batches of ``--batch`` transitions on
SmolLM2-135M-Instruct + LoRA r16 (float32, CPU), three ways:

- ``prefix``: the default (``pack_prefix_microbatches``): rows that share a prompt
  prefix (a writer's system prompt and schema, a checker's prompt) in one micro-batch,
  whose shared prefix runs once;
- ``length``: rows packed longest first (``pack_microbatches``), the shared prefix of each
  micro-batch still run once (what the warm start did before the prefix packing);
- ``plain``: no sharing, every row padded and run whole.

Prints seconds per step (median over the batches, after one warm-up step), the padded
positions the decoder runs per step, and the loss of the first batch (equal across the
three, within float noise).

    uv run python benchmarks/sft_bench.py examples/sql_agent/train.yaml --batches 4
    uv run python benchmarks/sft_bench.py examples/sql_agent/train.yaml --limit 100 --positions-only
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from boltrl.loading import load_object
from boltrl.records import Transition
from boltrl.store import open_store
from boltrl_trainer.batching import pack_microbatches, pack_prefix_microbatches, shared_prefix
from boltrl_trainer.config import load_config
from boltrl_trainer.demonstrations import collect
from boltrl_trainer.models import load_model
from boltrl_trainer.policy import apply_lora
from boltrl_trainer.sft import _MIN_SHARED, SFTBackend


class _LengthPacked(SFTBackend):
    """The packing before prefix packing: longest first, each micro-batch's common prefix
    still run once."""

    def _pack(self, items: Any) -> list[list[int]]:
        return pack_microbatches(items, self.token_budget)


def positions(items: list[Transition], micro: list[list[int]], share: bool) -> int:
    """Padded positions the decoder runs for ``micro`` (the shared prefix once)."""
    total = 0
    for mb in micro:
        rows = [items[i] for i in mb]
        longest = max(len(t.state) + len(t.action) for t in rows)
        s = shared_prefix([t.state for t in rows]) if share else 0
        s = s if s >= _MIN_SHARED else 0
        total += s + len(rows) * (longest - s)
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("config")
    ap.add_argument("--batch", type=int, default=None, help="default warm_start.batch_size")
    ap.add_argument("--batches", type=int, default=4, help="timed steps per way")
    ap.add_argument("--limit", type=int, default=32, help="training tasks demonstrated")
    ap.add_argument("--model", default=None, help="default: the config's model")
    ap.add_argument("--json", default=None, help="also write the rows here")
    ap.add_argument(
        "--positions-only",
        action="store_true",
        help="count each packing's decoder positions over every batch; train nothing",
    )
    args = ap.parse_args()

    overrides = [f"warm_start.limit={args.limit}"]
    if args.model:
        overrides.append(f"model={args.model}")
    cfg = load_config(args.config, overrides)
    ws = cfg.warm_start
    if ws is None:
        raise SystemExit(f"{args.config}: has no warm_start section")
    _, tok = load_model(cfg.model)
    store = open_store("memory://")
    try:
        demos = collect(
            cfg, ws, agent=load_object(cfg.agent, what="agent"), tokenizer=tok, store=store
        )
    finally:
        store.close()
    items = demos.transitions
    bs = args.batch or ws.batch_size
    budget = ws.token_budget or cfg.optim.token_budget
    batches = [items[i : i + bs] for i in range(0, len(items), bs)][: args.batches + 1]
    print(
        f"{args.config}: {len(items)} transitions from {demos.kept} demonstrations; "
        f"{'every batch' if args.positions_only else f'{len(batches) - 1} timed steps'} "
        f"of {bs}, token budget {budget}; "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, "
        f"load {os.getloadavg()[0]:.1f}"
    )
    assert cfg.lora is not None
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    rows: list[dict[str, Any]] = []
    print("| packing | s/step (median) | decoder positions/step | micro-batches/step | loss |")
    print("|---|---:|---:|---:|---:|")
    if args.positions_only:
        every = [items[i : i + bs] for i in range(0, len(items), bs)]
        for way in ("prefix", "length", "plain"):
            packs = [
                pack_prefix_microbatches(b, budget, _MIN_SHARED)
                if way == "prefix"
                else pack_microbatches(b, budget)
                for b in every
            ]
            pos = [positions(b, m, way != "plain") for b, m in zip(every, packs, strict=True)]
            row = {"packing": way, "positions": statistics.mean(pos)}
            row["microbatches"] = statistics.mean(len(m) for m in packs)
            rows.append(row)
            print(f"| {way} | - | {row['positions']:,.0f} | {row['microbatches']:.1f} | - |")
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))
        return
    for way in ("prefix", "length", "plain"):
        base, _ = load_model(cfg.model)
        lora = apply_lora(base, cfg.lora)
        cls = _LengthPacked if way == "length" else SFTBackend
        sft = cls(lora, lr=ws.lr, pad_id=int(pad), token_budget=budget, share_prefix=way != "plain")
        loss = sft.loss(batches[0])
        times, pos, mbs = [], [], []
        for k, b in enumerate(batches):
            micro = sft._pack(b)
            t0 = time.perf_counter()
            sft.step(b)
            if k:  # the first step warms up allocators and kernels
                times.append(time.perf_counter() - t0)
                pos.append(positions(b, micro, way != "plain"))
                mbs.append(len(micro))
        rows.append(
            {
                "packing": way,
                "s_per_step": statistics.median(times),
                "positions": statistics.mean(pos),
                "microbatches": statistics.mean(mbs),
                "loss": loss,
            }
        )
        print(
            f"| {way} | {statistics.median(times):.1f} | {statistics.mean(pos):,.0f} | "
            f"{statistics.mean(mbs):.1f} | {loss:.4f} |",
            flush=True,
        )
    print(f"load {os.getloadavg()[0]:.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
