"""The RL update on an agent's real transitions: the plain padded forward, each distinct
state once, and each distinct state once after the prefix the states share once.

Reads one training step's rollouts from a finished run's store (``boltrl train`` records
them: run name and step in their task metadata), turns them into transitions with the
config's credit assignment, and gives every rollout a GRPO advantage of its group
(zero-variance groups are kept, with zero advantages, so the batch is the whole step's:
the trainer would skip them). Then ``TorchTrainingBackend.update`` runs on that batch in
each mode, alternating, ``--repeat`` times after a warm-up, from the same weights (the
run's config; LoRA as configured, fresh adapters); medians. Prints seconds per update,
the padded positions the forward computes (the packing's cost) and the micro-batches.

``--merged`` adds a row: the same rollouts with ``credit.merge_prefix`` (each rollout's
calls one sequence when every call's prompt continues the one before; the loss averages
tokens per rollout, so the update is the same — ``tests/trainer/test_shared_prompt.py``),
in the fastest mode.

    uv run python benchmarks/agent_update_bench.py examples/calc_agent/train.yaml \
        --store runs/calc_agent/store.db --step 1
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

MERGED = "merged calls, prefix + states once"

MODES = {
    "plain": {"share": False, "min_shared": 16},
    "states once": {"share": True, "min_shared": 10**9},
    "prefix + states once": {"share": True, "min_shared": 16},
}


def _batch(cfg: Any, store_path: str, step: int, merge: bool = False) -> Any:
    from boltrl.credit import CreditConfig, transitions
    from boltrl.records import RolloutStatus
    from boltrl.store import open_store
    from boltrl_trainer.algorithms import compute_advantages, make_config
    from boltrl_trainer.seams import TrainBatch

    store = open_store(f"sqlite:///{store_path}")
    try:
        rollouts = [
            store.get(r.id)
            for r in store.query(limit=100_000)
            if r.task.metadata.get("phase") == "train"
            and r.task.metadata.get("step") == step
            and r.status == RolloutStatus.SUCCEEDED
        ]
    finally:
        store.close()
    if not rollouts:
        raise SystemExit(f"no succeeded training rollouts of step {step} in {store_path}")
    credit = CreditConfig.from_dict({**cfg.credit, **({"merge_prefix": True} if merge else {})})
    trans = [t for r in rollouts for t in transitions(r, credit)]
    algo = make_config("grpo", {"skip_zero_variance": False})
    adv = compute_advantages(trans, None, algo)
    trans = [t.model_copy(update={"policy_version": 0}) for t in trans]
    return TrainBatch(trans, adv.advantages.tolist(), 0, cfg.temperature), len(rollouts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("config")
    ap.add_argument("--store", required=True, help="the run's store.db")
    ap.add_argument("--step", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--merged", action="store_true", help="add the merged-calls row")
    args = ap.parse_args()

    from boltrl_trainer.algorithms import make_config
    from boltrl_trainer.batching import shared_cost
    from boltrl_trainer.config import load_config
    from boltrl_trainer.policy import load_policy
    from boltrl_trainer.update import TorchTrainingBackend

    cfg = load_config(args.config, ["progress=false", *args.set])
    batch, n_rollouts = _batch(cfg, args.store, args.step)
    batches = {m: batch for m in MODES}
    if args.merged:
        batches[MERGED] = _batch(cfg, args.store, args.step, merge=True)[0]
    model, tok = load_policy(cfg)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    trainer = TorchTrainingBackend(
        model, make_config(cfg.algorithm, cfg.algo), cfg.optim, pad_id=int(pad)
    )
    start = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    items = batch.transitions
    if args.merged:
        print(f"merged calls: {len(batches[MERGED].transitions)} transitions", flush=True)
    print(
        f"{args.config} step {args.step}: {n_rollouts} rollouts, {len(items)} transitions, "
        f"{len({tuple(t.state) for t in items})} distinct states, "
        f"{sum(len(t.state) for t in items):,} state and "
        f"{sum(len(t.action) for t in items):,} action tokens; token budget "
        f"{cfg.optim.token_budget}; load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    times: dict[str, list[float]] = {m: [] for m in batches}
    layout: dict[str, tuple[int, int, bool]] = {}
    import torch

    for rep in range(1 + args.repeat):
        order = list(batches) if rep % 2 == 0 else list(reversed(batches))
        for mode in order:
            spec = MODES.get(mode, MODES["prefix + states once"])
            items = batches[mode].transitions
            trainer._share_states = bool(spec["share"])
            trainer.min_shared = int(spec["min_shared"])
            with torch.no_grad():
                for n, p in model.named_parameters():
                    if n in start:
                        p.copy_(start[n])
            micro, shared = trainer._pack(items)
            if shared:
                cost = sum(shared_cost(items, b, trainer.min_shared) for b in micro)
            else:
                cost = sum(
                    len(b) * max(len(items[i].state) + len(items[i].action) for i in b)
                    for b in micro
                )
            layout[mode] = (cost, len(micro), shared)
            t0 = time.perf_counter()
            trainer.update(batches[mode])
            if rep > 0:  # the first round warms up
                times[mode].append(time.perf_counter() - t0)
            print(f"round {rep} {mode}: {time.perf_counter() - t0:.1f} s", flush=True)
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}\n")
    print("| forward | s / update (median) | positions computed | micro-batches |")
    print("|---|---:|---:|---:|")
    for mode in batches:
        cost, n, shared = layout[mode]
        label = mode if shared or mode == "plain" else f"{mode} (fell back to plain)"
        print(f"| {label} | {statistics.median(times[mode]):.1f} | {cost:,} | {n} |")


if __name__ == "__main__":
    main()
