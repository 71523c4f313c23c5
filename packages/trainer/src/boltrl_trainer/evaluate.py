"""``boltrl eval``: run the agent over task sets against a model, no training.

The model is the config's (served in-process, optionally from a training checkpoint)
or any OpenAI-compatible server (``--upstream URL --model NAME``, e.g. vLLM). Sampling
is greedy (temperature 0) unless told otherwise.

Eval keeps its runs: rollouts are recorded into the config's store (``store``, by
default ``sqlite:///{out_dir}/store.db``) or ``--store URL``, so ``boltrl dashboard`` and
``boltrl export`` see them. An eval's rollouts are told apart from training's by their
task metadata: ``run`` is the eval's run name (``eval-YYYYmmdd-HHMMSS`` in UTC unless
``--run-name`` gives one; training's is its ``out_dir`` name), ``phase`` is the split
(``val``, ``test``, ``train``), ``step`` is 0 and ``eval`` is ``true``; ``evaluated``
names what was evaluated (the checkpoint, the upstream model, or the config's model).

A store is one queue: runners take any queued rollout from it. So eval refuses to start
on a store with rollouts in flight (a training run using it right now would take the
eval's rollouts, and serve its own through the eval's gateway); pass ``--store`` to
record elsewhere.

A split whose every rollout failed has no score (``n/a``), not 0.
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
from boltrl.records import Rollout, RolloutStatus
from boltrl.scoring import ScoreSummary, rollout_score, summarize_scores
from boltrl.store import open_store
from boltrl_trainer.backends import backend_for
from boltrl_trainer.config import TrainConfig
from boltrl_trainer.failures import FailureGroup, summarize_failures
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

    @property
    def all_failed(self) -> bool:
        """Every rollout failed (and there was one): the split has no score."""
        return bool(self.rollouts) and self.failed == len(self.rollouts)

    @property
    def errors(self) -> list[FailureGroup]:
        """The failed rollouts grouped by error (``boltrl_trainer.failures``)."""
        return summarize_failures(self.rollouts)


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
    run_name: str | None = None,
    reporter: Reporter | None = None,
) -> list[SplitResult]:
    """Evaluate the configured agent on each named split; returns per-split results.

    Records into ``store_url`` (default: the config's store) under ``run_name`` (see the
    module docstring). Raises ``InvalidInput`` when that store has rollouts in flight.
    """
    sources = {"train": cfg.tasks.train, "val": cfg.tasks.val, "test": cfg.tasks.test}
    task_sets = {}
    for split in splits:
        src = sources.get(split)
        if src is None:
            raise InvalidInput(f"tasks.{split}: not set in the config; cannot evaluate it")
        task_sets[split] = load_tasks(src, split=split)[:limit]
    credit = CreditConfig.from_dict(cfg.credit)
    agent = load_object(cfg.agent, what="agent")
    url = store_url or cfg.store_url
    _make_parent(url)
    store = open_store(url)
    try:
        busy = sum(store.count(status=s) for s in _IN_FLIGHT)
        if busy:
            raise InvalidInput(
                f"--store: {url} has {busy} rollouts queued or running (a training run "
                "using it?); eval would share its queue. Pass --store URL to record elsewhere"
            )
        backend = _server(cfg, upstream, model, checkpoint)
    except BaseException:
        store.close()
        raise
    run = run_name or time.strftime("eval-%Y%m%d-%H%M%S", time.gmtime())
    evaluated = checkpoint or (model if upstream is not None else None) or cfg.model
    sampling = Sampling(temperature, cfg.top_p, cfg.max_tokens)
    session = RolloutSession.for_config(cfg, agent, backend, store, sampling, reporter=reporter)
    results = []
    try:
        with session:
            for split, tasks in task_sets.items():
                tagged = [
                    t.model_copy(
                        update={"metadata": {**t.metadata, "eval": True, "evaluated": evaluated}}
                    )
                    for t in tag_tasks(tasks, run=run, step=0, phase=split)
                ]
                rollouts = session.run(tagged, sampling, label=f"eval {split}")
                results.append(SplitResult(split, rollouts, credit))
    finally:
        _close(backend)
        store.close()
    return results


_IN_FLIGHT = (RolloutStatus.QUEUED, RolloutStatus.REQUEUED, RolloutStatus.RUNNING)


def _make_parent(url: str) -> None:
    """A SQLite store's folder (``out_dir`` on a first eval) is created, as training does."""
    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)


def _close(backend: Backend) -> None:
    asyncio.run(backend.aclose())


def all_failed(results: list[SplitResult]) -> bool:
    """Every rollout of the eval failed (over all splits, and there was one)."""
    rollouts = [r for res in results for r in res.rollouts]
    return bool(rollouts) and all(r.status != RolloutStatus.SUCCEEDED for r in rollouts)


def _errors_cell(res: SplitResult) -> str:
    groups = res.errors
    return ", ".join(f"{g.count}x {g.kind}" for g in groups)


def _error_of(r: Rollout) -> str:
    """One line of a failed rollout's error, for a task row."""
    groups = summarize_failures([r])
    return groups[0].message if groups else ""


def format_table(results: list[SplitResult], *, per_task: int = 0) -> str:
    """A plain-text table: one row per split (and up to ``per_task`` task rows each).

    ``reward`` is ``n/a`` for a split whose every rollout failed; when any failed, an
    ``errors`` column counts them by error kind, and a failed task's row ends with its
    error."""
    errors = "  errors" if any(res.failed for res in results) else ""
    lines = [f"{'split':<8} {'tasks':>6} {'reward':>8} {'± std':>7} {'failed':>7}{errors}"]
    for res in results:
        mean, std = ("n/a", "n/a") if res.all_failed else (f"{res.mean:.3f}", f"{res.std:.3f}")
        lines.append(
            f"{res.split:<8} {len(res.rollouts):>6} {mean:>8} {std:>7} {res.failed:>7}"
            f"  {_errors_cell(res)}".rstrip()
        )
    for res in results:
        if per_task <= 0:
            continue
        lines.append("")
        lines.append(f"{res.split}: {'task':<32} {'status':<10} {'reward':<7} error")
        for r, score in list(zip(res.rollouts, res.scores, strict=True))[:per_task]:
            rew = "-" if score is None else f"{score:.3f}"
            pad = " " * (len(res.split) + 2)
            err = _error_of(r)[:100] if score is None else ""
            lines.append(f"{pad}{r.task.id[:32]:<32} {r.status.value:<10} {rew:<7} {err}".rstrip())
        if len(res.rollouts) > per_task:
            lines.append(f"  … {len(res.rollouts) - per_task} more")
    return "\n".join(lines)


def write_report(results: list[SplitResult], path: Path) -> None:
    """``eval.json``: per split its score (``mean``/``std`` null when every rollout
    failed), its errors grouped (``boltrl_trainer.failures.FailureGroup``) and per task
    its status, reward and, when it failed, error kind and one-line error."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "time": time.time(),
        "splits": {
            r.split: {
                "mean": None if r.all_failed else r.mean,
                "std": None if r.all_failed else r.std,
                "tasks": len(r.rollouts),
                "failed": r.failed,
                "errors": [g.as_json() for g in r.errors],
                "per_task": [
                    _task_row(x, score) for x, score in zip(r.rollouts, r.scores, strict=True)
                ],
            }
            for r in results
        },
    }
    path.write_text(json.dumps(data, indent=2))


def _task_row(r: Rollout, score: float | None) -> dict[str, object]:
    row: dict[str, object] = {
        "task": r.task.id,
        "rollout": r.id,
        "status": r.status.value,
        "reward": score,
    }
    if score is None:
        groups = summarize_failures([r])
        if groups:
            row["error_kind"], row["error"] = groups[0].kind, groups[0].message
    return row
