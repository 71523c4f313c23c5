"""``boltrl eval``: run the agent over task sets against a model, no training.

The model is the config's (served in-process, optionally from a training checkpoint)
or any OpenAI-compatible server (``--upstream URL --model NAME``, e.g. vLLM). Sampling
is greedy (temperature 0) unless told otherwise.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from boltrl.errors import InvalidInput
from boltrl.loading import load_object
from boltrl.records import Rollout, RolloutStatus
from boltrl.store import open_store
from boltrl_trainer.config import TrainConfig
from boltrl_trainer.session import RolloutSession, Sampling, tag_tasks
from boltrl_trainer.tasks import load_tasks


@dataclass
class SplitResult:
    split: str
    rollouts: list[Rollout]

    @property
    def rewards(self) -> list[float]:
        return [
            (r.reward or 0.0) if r.status == RolloutStatus.SUCCEEDED else 0.0 for r in self.rollouts
        ]

    @property
    def mean(self) -> float:
        xs = self.rewards
        return sum(xs) / len(xs) if xs else 0.0

    @property
    def std(self) -> float:
        xs, m = self.rewards, self.mean
        return math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs)) if xs else 0.0

    @property
    def failed(self) -> int:
        return sum(r.status != RolloutStatus.SUCCEEDED for r in self.rollouts)


def _backend(
    cfg: TrainConfig, upstream: str | None, model: str | None, checkpoint: str | None
) -> Any:
    if upstream is not None:
        from boltrl.gateway.upstream import UpstreamBackend

        if model is None:
            raise InvalidInput("--model: required with --upstream (the served model's name)")
        return UpstreamBackend(upstream, model)
    from boltrl_trainer.serving import TransformersBackend
    from boltrl_trainer.trainer import load_policy

    policy, tok = load_policy(cfg if checkpoint else cfg.model_copy(update={"lora": None}))
    if checkpoint is not None:  # weights only: evaluation needs no optimizer state
        from boltrl_trainer.update import load_trainable

        load_trainable(policy, Path(checkpoint))
    return TransformersBackend(
        policy,
        tok,
        max_batch=cfg.concurrency,
        batch_window_s=0.02,
        max_tokens=cfg.max_tokens,
        model_name="policy",
        seed=cfg.seed,
    )


def evaluate(
    cfg: TrainConfig,
    splits: list[str],
    *,
    upstream: str | None = None,
    model: str | None = None,
    checkpoint: str | None = None,
    temperature: float = 0.0,
    limit: int | None = None,
    store_url: str | None = None,
) -> list[SplitResult]:
    """Evaluate the configured agent on each named split; returns per-split results."""
    sources = {"train": cfg.tasks.train, "val": cfg.tasks.val, "test": cfg.tasks.test}
    task_sets = {}
    for split in splits:
        src = sources.get(split)
        if src is None:
            raise InvalidInput(f"tasks.{split}: not set in the config; cannot evaluate it")
        task_sets[split] = load_tasks(src, split=split)[:limit]
    agent = load_object(cfg.agent, what="agent")
    backend = _backend(cfg, upstream, model, checkpoint)
    store = open_store(store_url or "memory://")
    sampling = Sampling(temperature, cfg.top_p, cfg.max_tokens)
    session = RolloutSession(
        agent,
        backend,
        store,
        concurrency=cfg.concurrency,
        default_sampling=sampling,
        timeout_s=cfg.rollout_timeout_s,
        max_attempts=cfg.max_attempts,
        progress=cfg.progress,
    )
    results = []
    try:
        with session:
            for split, tasks in task_sets.items():
                tagged = tag_tasks(tasks, run="eval", step=0, phase=split)
                results.append(
                    SplitResult(split, session.run(tagged, sampling, label=f"eval {split}"))
                )
    finally:
        close = getattr(backend, "close", None)
        if callable(close):
            close()
        store.close()
    return results


def format_table(results: list[SplitResult], *, per_task: int = 0) -> str:
    """A plain-text table: one row per split (and up to ``per_task`` task rows each)."""
    lines = [f"{'split':<8} {'tasks':>6} {'reward':>8} {'± std':>7} {'failed':>7}"]
    for res in results:
        lines.append(
            f"{res.split:<8} {len(res.rollouts):>6} {res.mean:>8.3f} "
            f"{res.std:>7.3f} {res.failed:>7}"
        )
    for res in results:
        if per_task <= 0:
            continue
        lines.append("")
        lines.append(f"{res.split}: {'task':<32} {'status':<10} reward")
        for r in res.rollouts[:per_task]:
            rew = "-" if r.reward is None else f"{r.reward:.3f}"
            pad = " " * (len(res.split) + 2)
            lines.append(f"{pad}{r.task.id[:32]:<32} {r.status.value:<10} {rew}")
        if len(res.rollouts) > per_task:
            lines.append(f"  … {len(res.rollouts) - per_task} more")
    return "\n".join(lines)


def write_report(results: list[SplitResult], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "time": time.time(),
        "splits": {
            r.split: {
                "mean": r.mean,
                "std": r.std,
                "tasks": len(r.rollouts),
                "failed": r.failed,
                "per_task": [
                    {"task": x.task.id, "status": x.status.value, "reward": x.reward}
                    for x in r.rollouts
                ],
            }
            for r in results
        },
    }
    path.write_text(json.dumps(data, indent=2))
