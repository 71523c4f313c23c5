"""Prefix reuse in the in-process backend, on an example's real agent: wall time of its
rollouts with the prompt cache and without it (``cache_positions=0``), prompt positions
computed and taken from the cache, and peak memory. A third mode keeps the cache but not
``freeze_long_lived`` (the session's ``gc.freeze`` after setup), so every finished async
rollout's garbage collection scans the whole heap again.

An example's agent runs on ``--tasks`` validation tasks (greedy, as validation runs them;
``--temperature T --group G``: G samples of each task at T, as a training step runs them)
through the real gateway and ``RolloutSession``, its model served as ``boltrl train``
serves it (``serve_policy``; a warm-start or RL checkpoint with ``--checkpoint``). The two
modes alternate ``--repeat`` times in one process, so load from other work hits both;
medians over the repeats. Peak memory is the process's RSS high-water mark after each run
(it only grows: read the first rows of each mode).

    uv run python benchmarks/prefix_bench.py examples/calc_agent/train.yaml --tasks 24
    uv run python benchmarks/prefix_bench.py examples/rag_agent/train.yaml --tasks 8 \
        --checkpoint runs/rag_agent/warm_start/checkpoints/step-000012
    uv run python benchmarks/prefix_bench.py examples/calc_agent/train.yaml --tasks 8 \
        --temperature 0.7 --group 4
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from boltrl.runner import freeze_long_lived


def one_run(
    cfg: Any,
    checkpoint: str | None,
    positions: int,
    tasks: list[Any],
    temp: float,
    freeze: bool = True,
) -> dict[str, float]:
    from boltrl.credit import CreditConfig
    from boltrl.loading import load_object
    from boltrl.scoring import summarize_scores
    from boltrl.store import open_store
    from boltrl_trainer import session as session_module
    from boltrl_trainer.policy import load_policy
    from boltrl_trainer.serving import TransformersBackend
    from boltrl_trainer.session import RolloutSession, Sampling

    gc.unfreeze()  # every mode starts from a heap nothing froze
    session_module.freeze_long_lived = freeze_long_lived if freeze else (lambda: None)

    model, tok = load_policy(cfg, lora=checkpoint is not None)
    backend = TransformersBackend(
        model,
        tok,
        max_batch=max(cfg.concurrency, 1),
        batch_window_s=0.02,
        max_tokens=cfg.max_tokens,
        model_name="policy",
        seed=cfg.seed,
        cache_positions=positions,
    )
    if checkpoint is not None:
        backend.load_weights(Path(checkpoint))
    agent = load_object(cfg.agent, what="agent")
    sampling = Sampling(temp, cfg.top_p, cfg.max_tokens)
    with tempfile.TemporaryDirectory() as d:
        store = open_store(f"sqlite:///{d}/store.db")
        session = RolloutSession.for_config(cfg, agent, backend, store, sampling)
        try:
            with session:
                t0 = time.perf_counter()
                rollouts = session.run(tasks, sampling, label=f"cache {positions}")
                wall = time.perf_counter() - t0
        finally:
            stats = backend.stats()
            backend.close()
            store.close()
    score = summarize_scores(rollouts, CreditConfig.from_dict(cfg.credit), failed_as=0.0)
    return {
        "wall_s": wall,
        "reward": score.mean,
        "requests": stats["requests"],
        "prompt_tokens": stats["prompt_tokens"],
        "prefill_tokens": stats["prefill_tokens"],
        "cached_tokens": stats["cached_tokens"],
        "completion_tokens": stats["completion_tokens"],
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("config")
    ap.add_argument("--tasks", type=int, default=24, help="first N validation tasks")
    ap.add_argument("--checkpoint", default=None)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--group", type=int, default=1, help="samples of each task")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument(
        "--positions", type=int, default=None, help="the cache's budget (default: the backend's)"
    )
    args = ap.parse_args()

    from boltrl_trainer._prompt_cache import DEFAULT_CACHE_POSITIONS
    from boltrl_trainer.config import load_config
    from boltrl_trainer.session import tag_tasks
    from boltrl_trainer.tasks import load_tasks

    cfg = load_config(args.config, ["progress=false", *args.set])
    assert cfg.tasks.val is not None, "the config names no validation tasks"
    val = load_tasks(cfg.tasks.val, split="val")[: args.tasks]
    positions = DEFAULT_CACHE_POSITIONS if args.positions is None else args.positions
    load0 = os.getloadavg()[0]
    modes = {
        f"on, {positions} positions": (positions, True),
        "off": (0, True),
        f"on, {positions} positions, no gc.freeze": (positions, False),
    }
    runs: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    for rep in range(args.repeat):
        for mode in list(modes) if rep % 2 == 0 else list(reversed(modes)):
            size, freeze = modes[mode]
            tasks = tag_tasks(
                val, run=f"bench-{rep}-{len(runs[mode])}", step=0, phase="val", repeat=args.group
            )
            r = one_run(cfg, args.checkpoint, size, tasks, args.temperature, freeze)
            runs[mode].append(r)
            print(
                f"repeat {rep} cache {mode}: {r['wall_s']:.1f} s, reward {r['reward']:.3f}, "
                f"prefill {r['prefill_tokens']:.0f} / cached {r['cached_tokens']:.0f} of "
                f"{r['prompt_tokens']:.0f} prompt tokens, {r['completion_tokens']:.0f} generated, "
                f"peak RSS {r['peak_rss_mb']:.0f} MB",
                flush=True,
            )
    load1 = os.getloadavg()[0]
    print(
        f"\n{args.config}: {len(val)} tasks x {args.group} at temperature {args.temperature}, "
        f"{args.repeat} repeats, load average {load0:.1f} -> {load1:.1f}\n"
    )
    print(
        "| prompt cache | wall s (median) | prompt positions computed | from the cache | reward |"
    )
    print("|---|---:|---:|---:|---:|")
    med = statistics.median
    for label, rs in runs.items():
        wall = med(r["wall_s"] for r in rs)
        computed = med(r["prefill_tokens"] for r in rs)
        cached = med(r["cached_tokens"] for r in rs)
        reward = med(r["reward"] for r in rs)
        print(f"| {label} | {wall:.1f} | {computed:,.0f} | {cached:,.0f} | {reward:.3f} |")


if __name__ == "__main__":
    main()
