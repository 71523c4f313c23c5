"""``boltrl eval``: run the agent over task sets against a model, no training.

The model is the config's (served in-process, optionally from a training checkpoint)
or any OpenAI-compatible server (``--upstream URL --model NAME``, e.g. vLLM). Sampling
is greedy (temperature 0) unless told otherwise.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from boltrl.credit import CreditConfig
from boltrl.errors import InvalidInput
from boltrl.gateway.backend import Backend
from boltrl.loading import load_object
from boltrl.records import Rollout
from boltrl.scoring import ScoreSummary, rollout_score, summarize_scores
from boltrl.store import open_store
from boltrl_trainer.backends import backend_for
from boltrl_trainer.config import TrainConfig
from boltrl_trainer.reporting import Reporter
from boltrl_trainer.session import RolloutSession, Sampling, tag_tasks
from boltrl_trainer.tasks import load_tasks


@dataclass
class SplitResult:
    """One split's rollouts, scored as training scores them (``boltrl.scoring``)."""

    split: str
    rollouts: list[Rollout]
    credit: CreditConfig = field(default_factory=CreditConfig)

    @property
    def scores(self) -> list[float | None]:
        """Per rollout its score; None for one that did not succeed."""
        return [rollout_score(r, self.credit) for r in self.rollouts]

    @property
    def summary(self) -> ScoreSummary:
        """Mean and spread over every task; a rollout that did not succeed scores 0."""
        return summarize_scores(self.rollouts, self.credit, failed_as=0.0)

    @property
    def mean(self) -> float:
        return self.summary.mean

    @property
    def std(self) -> float:
        return self.summary.std

    @property
    def failed(self) -> int:
        return self.summary.failed


def _server(
    cfg: TrainConfig, upstream: str | None, model: str | None, checkpoint: str | None
) -> Backend:
    if upstream is not None:
        from boltrl.gateway.upstream import UpstreamBackend

        if model is None:
            raise InvalidInput("--model: required with --upstream (the served model's name)")
        return UpstreamBackend(upstream, model)
    return backend_for(cfg).serve(cfg, None if checkpoint is None else Path(checkpoint))


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
    reporter: Reporter | None = None,
) -> list[SplitResult]:
    """Evaluate the configured agent on each named split; returns per-split results."""
    sources = {"train": cfg.tasks.train, "val": cfg.tasks.val, "test": cfg.tasks.test}
    task_sets = {}
    for split in splits:
        src = sources.get(split)
        if src is None:
            raise InvalidInput(f"tasks.{split}: not set in the config; cannot evaluate it")
        task_sets[split] = load_tasks(src, split=split)[:limit]
    credit = CreditConfig.from_dict(cfg.credit)
    agent = load_object(cfg.agent, what="agent")
    backend = _server(cfg, upstream, model, checkpoint)
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
        reporter=reporter,
        credit=credit,
    )
    results = []
    try:
        with session:
            for split, tasks in task_sets.items():
                tagged = tag_tasks(tasks, run="eval", step=0, phase=split)
                rollouts = session.run(tagged, sampling, label=f"eval {split}")
                results.append(SplitResult(split, rollouts, credit))
    finally:
        _close(backend)
        store.close()
    return results


def _close(backend: Backend) -> None:
    asyncio.run(backend.aclose())


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
        for r, score in list(zip(res.rollouts, res.scores, strict=True))[:per_task]:
            rew = "-" if score is None else f"{score:.3f}"
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
                    {"task": x.task.id, "status": x.status.value, "reward": score}
                    for x, score in zip(r.rollouts, r.scores, strict=True)
                ],
            }
            for r in results
        },
    }
    path.write_text(json.dumps(data, indent=2))
