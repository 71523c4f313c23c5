"""The training loop of ``boltrl train``: read top to bottom.

setup: the registry entry of ``cfg.backend`` (checked) builds a policy server and a
       training backend (``boltrl_trainer.seams``) → store → gateway + runners (a session).
step:  enqueue batch_tasks x group_size rollouts → wait → transitions (credit
       assignment) → advantages → update inside ``weight_swap`` (generation paused)
       → policy version + 1. With ``dynamic_sampling``, more rounds of fresh tasks run
       while too few groups have differing returns (``DynamicSamplingConfig``).
every val_every steps: held-out tasks at temperature 0. Checkpoints and ``resume``.
async (``async: {max_staleness: k}``, ``_run_async``): one rollout thread runs the
       next steps' rollouts (up to k steps ahead) while the update trains a separate
       copy of the weights; generation pauses only while ``seams.promote_swap`` copies
       them in. Transitions older than k versions are dropped and counted; the rest are
       trained with decoupled PPO (``boltrl_trainer.offpolicy``).
Each phase reports one line per distinct error of its failed rollouts; a step whose
every rollout failed stops the run (``failures.AllRolloutsFailed``): there is nothing
to train on, and the next step would fail the same way.
Rewards are reported as ``boltrl.scoring`` scores: the return training uses.
"""

from __future__ import annotations

import functools
import json
import logging
import queue
import random
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from boltrl.credit import CreditConfig, MissingTokenIds, final_reward, transitions
from boltrl.errors import InvalidInput
from boltrl.loading import load_object
from boltrl.records import Rollout, RolloutStatus, Task, Transition
from boltrl.scoring import summarize_scores
from boltrl.store import open_store
from boltrl.store.base import Store
from boltrl_trainer.algorithms import (
    ReinforceConfig,
    RunningBaseline,
    compute_advantages,
    make_config,
)
from boltrl_trainer.backends import backend_for
from boltrl_trainer.config import TrainConfig
from boltrl_trainer.failures import AllRolloutsFailed, failure_lines
from boltrl_trainer.lineage import run_lineage
from boltrl_trainer.malloc_tuning import tune_malloc
from boltrl_trainer.metrics import MetricsWriter, plot_rewards
from boltrl_trainer.offpolicy import select_fresh
from boltrl_trainer.reporting import LogReporter, Reporter
from boltrl_trainer.seams import (
    CandidateTrainer,
    PolicyServer,
    TrainBatch,
    TrainingBackend,
    promote_swap,
    weight_swap,
)
from boltrl_trainer.session import RolloutSession, Sampling, tag_tasks
from boltrl_trainer.tasks import load_tasks

log = logging.getLogger(__name__)

_T = TypeVar("_T")


@dataclass
class _Rollouts:
    """One step's finished training rollouts and what producing them took."""

    rollouts: list[Rollout]
    label: str
    seconds: float
    """Wall time from enqueueing to the last rollout's end."""
    generation_s: float
    """Seconds the backend was generating meanwhile."""
    tokens: int
    """Completion tokens generated meanwhile."""
    sampled: int = 0
    """Rollouts run, dropped ones included (``rollouts`` may hold fewer: see trimmed)."""
    rounds: int = 1
    """Rounds of ``batch_tasks`` tasks run (more than one only with dynamic sampling)."""
    informative: int | None = None
    """Groups with differing returns among all rounds' (dynamic sampling only)."""
    trimmed: int = 0
    """Informative groups beyond ``batch_tasks``, dropped from ``rollouts``."""


class _RolloutThread:
    """Runs rollout phases one at a time, in submission order, beside the training loop.

    A daemon thread: a run that fails mid-phase must not keep the process alive waiting
    for rollouts nobody will finish."""

    def __init__(self) -> None:
        self._jobs: queue.Queue[tuple[Callable[[], Any], Future[Any]] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._work, name="boltrl-rollouts", daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], _T]) -> Future[_T]:
        fut: Future[_T] = Future()
        self._jobs.put((fn, fut))
        return fut

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            fn, fut = job
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn())
            except BaseException as e:  # handed to the loop, which raises it
                fut.set_exception(e)

    def close(self) -> None:
        self._jobs.put(None)


@dataclass
class TrainResult:
    """What a training run produced."""

    steps_done: int
    val_history: list[tuple[int, float]] = field(default_factory=list)
    """(step, mean val score) pairs, step 0 = before training."""
    out_dir: Path = Path(".")
    plot: Path | None = None

    @property
    def val_before(self) -> float | None:
        return self.val_history[0][1] if self.val_history else None

    @property
    def val_after(self) -> float | None:
        return self.val_history[-1][1] if self.val_history else None


def _group_of(task: Task) -> str:
    """The group a task's rollouts train in (``boltrl.credit.transitions``' rule)."""
    return task.group if task.group is not None else task.id


def _is_mixed(returns: list[float]) -> bool:
    """Whether a group's returns differ: else its advantages are all zero (GRPO, RLOO)."""
    return len(returns) > 1 and max(returns) - min(returns) > 1e-12


def _informative(order: list[str], returns: dict[str, list[float]]) -> list[str]:
    """The groups of ``order`` (once each, in order) whose returns differ."""
    return [g for g in dict.fromkeys(order) if _is_mixed(returns.get(g, []))]


class Trainer:
    """One ``boltrl train`` run. Use ``Trainer(cfg).run(resume=...)``.

    ``reporter`` receives the per-step and validation lines and the rollout phases'
    progress (default: logging; the CLI hands in its console reporter).
    """

    def __init__(
        self, cfg: TrainConfig, *, run_name: str | None = None, reporter: Reporter | None = None
    ) -> None:
        self.kind = backend_for(cfg)  # e.g. says how to install verl and vLLM when missing
        if cfg.tasks.train is None:
            raise InvalidInput("tasks.train: required for training (a .jsonl file or module:fn)")
        if cfg.async_ is not None and cfg.backend != "torch":
            raise InvalidInput(
                "async: the torch backend only for now (backend: torch), or async: null"
            )
        ds = cfg.dynamic_sampling
        if ds is not None and ds.min_groups > cfg.batch_tasks:
            raise InvalidInput(
                f"dynamic_sampling.min_groups: {ds.min_groups} is more than batch_tasks "
                f"({cfg.batch_tasks}), the most groups an update trains"
            )
        if ds is not None and (cfg.algorithm == "reinforce" or cfg.group_size < 2):
            raise InvalidInput(
                "dynamic_sampling: needs groups that share a baseline (algorithm: grpo or "
                f"rloo, group_size >= 2; here {cfg.algorithm}, group_size {cfg.group_size})"
            )
        if cfg.steps > 0 and not cfg.temperature > 0:
            raise InvalidInput(
                "temperature: must be > 0 for training rollouts (validation always uses 0)"
            )
        self.cfg = cfg
        self.out = Path(cfg.out_dir)
        self.run_name = run_name or self.out.name
        self.reporter: Reporter = reporter or LogReporter()
        self.algo = make_config(cfg.algorithm, cfg.algo)
        self.credit = CreditConfig.from_dict(cfg.credit)
        self.agent = load_object(cfg.agent, what="agent")
        self.train_tasks = load_tasks(cfg.tasks.train, split="train")
        self.val_tasks: list[Task] = []
        if cfg.tasks.val is not None:
            self.val_tasks = load_tasks(cfg.tasks.val, split="val")[: cfg.tasks.limit_val]
        self.baseline = RunningBaseline()
        self.counters = {"failed_rollouts": 0, "refused_rollouts": 0}

    # -- the run --------------------------------------------------------------------

    def run(self, *, resume: bool = False) -> TrainResult:
        import torch

        cfg = self.cfg
        self.out.mkdir(parents=True, exist_ok=True)
        random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)
        tune_malloc()  # before the runner threads: freed activations go back to the OS
        t0 = time.perf_counter()
        server, trainer = self.kind.build(cfg)
        store = open_store(cfg.store_url)
        metrics = MetricsWriter(
            self.out,
            report_to=cfg.report_to,
            run_name=self.run_name,
            config=cfg.model_dump(mode="json"),
            lineage=run_lineage(cfg, resume=resume),
        )
        try:
            start_step, history = 0, list[tuple[int, float]]()
            if resume:
                start_step, history = self._resume(trainer, server, store)
            elif cfg.init_from is not None or cfg.warm_start is not None:
                from boltrl_trainer.warm_start import prepare_policy

                prepare_policy(
                    cfg,
                    agent=self.agent,
                    server=server,
                    trainer=trainer,
                    store=store,
                    out_dir=self.out,
                    reporter=self.reporter,
                )
            log.info("model ready in %.1fs (backend %s)", time.perf_counter() - t0, cfg.backend)
            train_sampling = Sampling(cfg.temperature, cfg.top_p, cfg.max_tokens)
            session = RolloutSession.for_config(
                cfg, self.agent, server, store, train_sampling, reporter=self.reporter
            )
            with session:
                if not history and self.val_tasks:
                    history.append((0, self._validate(session, 0, metrics)))
                if cfg.async_ is not None:
                    self._run_async(session, server, trainer, start_step, history, metrics)
                else:
                    self._run_sync(session, server, trainer, start_step, history, metrics)
        finally:
            metrics.close()
            server.close()
            trainer.close()
            store.close()
        plot = None
        if (self.out / "metrics.jsonl").exists():
            plot = plot_rewards(
                self.out / "metrics.jsonl",
                self.out / "reward.png",
                title=f"boltrl: {self.run_name}",
            )
        return TrainResult(cfg.steps, history, self.out, plot)

    def _run_sync(
        self,
        session: RolloutSession,
        server: PolicyServer,
        trainer: TrainingBackend,
        start: int,
        history: list[tuple[int, float]],
        metrics: MetricsWriter,
    ) -> None:
        """Steps ``start + 1 ..``, each rollouts then update (generation paused)."""
        cfg = self.cfg
        sampling = Sampling(cfg.temperature, cfg.top_p, cfg.max_tokens)
        for step in range(start + 1, cfg.steps + 1):
            self._step(session, server, trainer, step, metrics, sampling)
            last = step == cfg.steps
            if self.val_tasks and (last or (cfg.val_every and step % cfg.val_every == 0)):
                history.append((step, self._validate(session, step, metrics)))
            if last or (cfg.checkpoint_every and step % cfg.checkpoint_every == 0):
                self._checkpoint(trainer, step, history)

    def _run_async(
        self,
        session: RolloutSession,
        server: PolicyServer,
        trainer: TrainingBackend,
        start: int,
        history: list[tuple[int, float]],
        metrics: MetricsWriter,
    ) -> None:
        """Steps ``start + 1 ..`` with rollouts running ahead of the update (module doc).

        Step ``j``'s rollouts are launched once step ``j - 1 - k``'s weights are served,
        so no call of theirs is more than ``k`` updates older than the update that trains
        them (a skipped update does not change the version: fewer versions, not more);
        the rollout thread runs phases in launch order, so each batch is trained once, by
        step ``j``. Validation of step ``s`` is queued right after the running batch and
        finished before version ``s + 1`` is served: it sees version ``s`` only."""
        cfg = self.cfg
        assert cfg.async_ is not None
        k = cfg.async_.max_staleness
        if not isinstance(trainer, CandidateTrainer):
            raise InvalidInput(f"async: backend {cfg.backend} cannot train a separate copy")
        trainer.use_separate_copy()  # after resume / warm start: the served weights are final
        sampling = Sampling(cfg.temperature, cfg.top_p, cfg.max_tokens)
        worker = _RolloutThread()
        pending: dict[int, Future[_Rollouts]] = {}
        next_step, served_step = start + 1, start
        val: tuple[int, Future[list[Rollout]]] | None = None

        def launch() -> None:
            nonlocal next_step
            while next_step <= cfg.steps and next_step - 1 - served_step <= k:
                j = next_step
                pending[j] = worker.submit(
                    functools.partial(self._train_rollouts, session, server, j, sampling)
                )
                next_step += 1

        def finish_val() -> float:
            nonlocal val
            if val is None:
                return 0.0
            t0 = time.perf_counter()
            at, fut = val
            history.append((at, self._record_val(at, fut.result(), metrics)))
            val = None
            return time.perf_counter() - t0

        try:
            launch()
            t_prev = time.perf_counter()
            for step in range(start + 1, cfg.steps + 1):
                t0 = time.perf_counter()
                got = pending.pop(step).result()
                wait_s = time.perf_counter() - t0
                batch, stats = self._prepare(got, trainer, sampling, max_staleness=k)
                busy0 = session.backend.busy_s
                upd = trainer.update(batch)  # a copy: generation goes on meanwhile
                overlap_s = session.backend.busy_s - busy0
                val_wait_s = finish_val()  # validation must not see the next version
                t1 = time.perf_counter()
                promote_swap(server, trainer)
                swap_s = time.perf_counter() - t1
                served_step = step
                session.publish()
                last = step == cfg.steps
                if self.val_tasks and (last or (cfg.val_every and step % cfg.val_every == 0)):
                    val = (
                        step,
                        worker.submit(functools.partial(self._val_rollouts, session, step)),
                    )
                launch()
                if last or (cfg.checkpoint_every and step % cfg.checkpoint_every == 0):
                    val_wait_s += finish_val()
                    self._checkpoint(trainer, step, history)
                now = time.perf_counter()
                step_s, t_prev = now - t_prev, now
                update_s = upd.get("time/update_s", 0.0)
                timing = {
                    "time/step_s": step_s,
                    "time/rollout_s": got.seconds,
                    "time/generation_s": got.generation_s,
                    "time/wait_rollouts_s": wait_s,
                    "time/overlap_s": overlap_s,  # generating while the update ran
                    "time/swap_s": swap_s,
                    "time/val_wait_s": val_wait_s,
                    "time/overhead_s": max(step_s - wait_s - update_s - swap_s - val_wait_s, 0.0),
                }
                self._report_step(step, got, stats, upd, timing, server, trainer, metrics)
        finally:
            for fut in pending.values():
                fut.cancel()
            worker.close()

    def _train_rollouts(
        self, session: RolloutSession, server: PolicyServer, step: int, sampling: Sampling
    ) -> _Rollouts:
        """Step ``step``'s training rollouts (its tasks depend on the step only), timed.

        With ``dynamic_sampling``, rounds of ``batch_tasks`` fresh tasks run until enough
        groups have differing returns (or ``max_rounds``, or no task is left); then the
        informative groups beyond ``batch_tasks`` are dropped (``DynamicSamplingConfig``)."""
        cfg = self.cfg
        ds = cfg.dynamic_sampling
        t0 = time.perf_counter()
        rng = random.Random(f"{cfg.seed}-{step}")  # resumable: tasks depend on step only
        busy0 = session.backend.busy_s
        tokens0 = server.stats().get("completion_tokens", 0)
        label = f"step {step}/{cfg.steps}"
        rollouts: list[Rollout] = []
        order: list[str] = []  # the groups in sampling order
        returns: dict[str, list[float]] = {}
        rest = list(range(len(self.train_tasks)))
        rounds = 0
        while rest and rounds < (ds.max_rounds if ds is not None else 1):
            # indices, not tasks: random.sample draws the same positions either way, so
            # the first round is what it was before dynamic sampling existed
            picked = [
                rest[j] for j in rng.sample(range(len(rest)), min(cfg.batch_tasks, len(rest)))
            ]
            taken = set(picked)
            rest = [i for i in rest if i not in taken]
            chosen = [self.train_tasks[i] for i in picked]
            rounds += 1
            tasks = tag_tasks(
                chosen,
                run=self.run_name,
                step=step,
                phase="train",
                repeat=cfg.group_size,
                extra={"round": rounds} if ds is not None else None,
            )
            got = session.run(
                tasks, sampling, label=label if rounds == 1 else f"{label} round {rounds}"
            )
            rollouts.extend(got)
            order.extend(_group_of(t) for t in chosen)
            if ds is None or all(r.status != RolloutStatus.SUCCEEDED for r in got):
                break  # a round that failed whole: _prepare reports it (and stops the run)
            for g, values in self._group_returns(got).items():
                returns.setdefault(g, []).extend(values)
            if len(_informative(order, returns)) >= ds.min_groups:
                break
        sampled, informative, trimmed = len(rollouts), None, 0
        if ds is not None:
            mixed = _informative(order, returns)
            informative = len(mixed)
            drop = set(mixed[cfg.batch_tasks :])
            trimmed = len(drop)
            rollouts = [r for r in rollouts if _group_of(r.task) not in drop]
        return _Rollouts(
            rollouts=rollouts,
            label=label,
            seconds=time.perf_counter() - t0,
            generation_s=session.backend.busy_s - busy0,
            tokens=server.stats().get("completion_tokens", 0) - tokens0,
            sampled=sampled,
            rounds=rounds,
            informative=informative,
            trimmed=trimmed,
        )

    def _group_returns(self, rollouts: list[Rollout]) -> dict[str, list[float]]:
        """Each group's rollout returns as the advantages will see them: a succeeded
        rollout's first transition's reward (its return under either credit mode);
        rollouts that cannot train (failed, no token ids, no calls) are left out."""
        out: dict[str, list[float]] = {}
        for r in rollouts:
            if r.status != RolloutStatus.SUCCEEDED:
                continue
            try:
                trans = transitions(r, self.credit)
            except MissingTokenIds:
                continue
            if trans:
                first = min(trans, key=lambda t: t.step)
                out.setdefault(first.group, []).append(first.reward)
        return out

    def _step(
        self,
        session: RolloutSession,
        server: PolicyServer,
        trainer: TrainingBackend,
        step: int,
        metrics: MetricsWriter,
        sampling: Sampling,
    ) -> None:
        """The synchronous step: rollouts, then the update with generation paused."""
        t_step = time.perf_counter()
        got = self._train_rollouts(session, server, step, sampling)
        batch, stats = self._prepare(got, trainer, sampling, max_staleness=None)
        with weight_swap(server, trainer):
            upd = trainer.update(batch)
        session.publish()
        step_s = time.perf_counter() - t_step
        timing = {
            "time/step_s": step_s,
            "time/rollout_s": got.seconds,
            "time/generation_s": got.generation_s,
            # everything that is neither generating nor updating: store, gateway, agents,
            # runners, credit assignment, batching
            "time/overhead_s": max(step_s - got.generation_s - upd.get("time/update_s", 0.0), 0.0),
        }
        self._report_step(step, got, stats, upd, timing, server, trainer, metrics)

    def _prepare(
        self,
        got: _Rollouts,
        trainer: TrainingBackend,
        sampling: Sampling,
        *,
        max_staleness: int | None,
    ) -> tuple[TrainBatch, dict[str, float]]:
        """The step's batch, after stopping the run when every rollout failed."""
        rollouts = got.rollouts
        if rollouts and all(r.status != RolloutStatus.SUCCEEDED for r in rollouts):
            # nothing to train on, and every later step would fail the same way
            raise AllRolloutsFailed(
                "\n".join(
                    [
                        f"{got.label}: every rollout failed; nothing to train on, stopping",
                        *failure_lines(got.label, rollouts)[1:],
                    ]
                )
            )
        t_prep = time.perf_counter()
        batch, stats = self._batch(
            rollouts, trainer.policy_version, sampling.temperature, max_staleness
        )
        stats["time/prepare_s"] = time.perf_counter() - t_prep
        return batch, stats

    def _report_step(
        self,
        step: int,
        got: _Rollouts,
        stats: dict[str, float],
        upd: dict[str, float],
        timing: dict[str, float],
        server: PolicyServer,
        trainer: TrainingBackend,
        metrics: MetricsWriter,
    ) -> None:
        gen = server.stats()
        row = {
            **stats,
            **upd,
            "policy_version": trainer.policy_version,
            **timing,
            "throughput/completion_tokens_total": gen.get("completion_tokens", 0),
            "throughput/tokens_per_s": got.tokens / max(got.seconds, 1e-9),
            "throughput/rollouts_per_s": (got.sampled or len(got.rollouts))
            / max(got.seconds, 1e-9),
        }
        if got.informative is not None:  # dynamic sampling
            row["train/rounds"] = float(got.rounds)
            row["train/sampled_rollouts"] = float(got.sampled)
            row["train/informative_groups"] = float(got.informative)
            row["train/trimmed_groups"] = float(got.trimmed)
        metrics.write(step, row)
        self.reporter.line(
            f"step {step:>3} | reward {stats['train/reward_mean']:.3f} ± "
            f"{stats['train/reward_std']:.3f} | loss {upd.get('update/loss', 0.0):+.4f} "
            f"| kl {upd.get('update/approx_kl', 0.0):.4f} "
            f"| clip {upd.get('update/clip_frac', 0.0):.3f}"
            f" | failed {stats['train/failed']:.0f} skipped {stats['train/skipped_groups']:.0f}"
            + (f" | rounds {got.rounds}" if got.informative is not None else "")
            + f" | {got.seconds:.1f}s rollout + {upd.get('time/update_s', 0.0):.1f}s update"
            + (
                f" | stale {stats['offpolicy/staleness_mean']:.2f} "
                f"dropped {stats['offpolicy/dropped']:.0f}"
                if self.cfg.async_ is not None
                else ""
            )
        )

    def _batch(
        self,
        rollouts: list[Rollout],
        version: int,
        temperature: float,
        max_staleness: int | None = None,
    ) -> tuple[TrainBatch, dict[str, float]]:
        """Transitions and advantages of the succeeded rollouts (failed ones are dropped
        and counted, not scored 0); transitions more than ``max_staleness`` versions older
        than ``version`` are dropped and counted (``offpolicy/*``) before the advantages."""
        ok = [r for r in rollouts if r.status == RolloutStatus.SUCCEEDED]
        failed = len(rollouts) - len(ok)
        self.counters["failed_rollouts"] += failed
        trans: list[Transition] = []
        refused = 0
        for r in ok:
            try:
                trans.extend(transitions(r, self.credit))
            except MissingTokenIds as e:
                refused += 1
                log.error("refusing rollout %s for training: %s", r.id, e)
        self.counters["refused_rollouts"] += refused
        trans, staleness = select_fresh(trans, version, max_staleness)
        self.counters["stale_dropped"] = self.counters.get("stale_dropped", 0) + staleness.dropped
        score = summarize_scores(ok, self.credit)
        stats: dict[str, float] = {
            "train/reward_mean": score.mean,
            "train/reward_std": score.std,
            "train/rollouts": float(len(rollouts)),
            "train/failed": float(failed),
            "train/refused": float(refused),
            "train/transitions": float(len(trans)),
            "train/skipped_groups": 0.0,
            "train/trained_groups": 0.0,
            "train/shaping_only_groups": 0.0,
            **staleness.metrics(),
        }
        if not trans:
            return TrainBatch([], [], version, temperature), stats
        adv = compute_advantages(trans, None, self.algo, running=self.baseline)
        keep = adv.keep.tolist()
        stats["train/skipped_groups"] = adv.stats.get("skipped_groups", 0.0)
        # the groups the update learns from (mixed returns): a step's signal, which
        # benchmarks/recipe_seeds.py sums over a run
        stats["train/trained_groups"] = adv.stats.get("groups", 0.0) - stats["train/skipped_groups"]
        if not isinstance(self.algo, ReinforceConfig):  # its baseline is not the group's
            stats["train/shaping_only_groups"] = float(
                _shaping_only_groups(ok, trans, keep, self.credit)
            )
        stats["train/advantage_abs_mean"] = float(adv.advantages.abs().mean())
        kept = [t for t, k in zip(trans, keep, strict=True) if k]
        values = [a for a, k in zip(adv.advantages.tolist(), keep, strict=True) if k]
        return TrainBatch(kept, values, version, temperature, [t.group for t in kept]), stats

    def _validate(self, session: RolloutSession, step: int, metrics: MetricsWriter) -> float:
        return self._record_val(step, self._val_rollouts(session, step), metrics)

    def _val_rollouts(self, session: RolloutSession, step: int) -> list[Rollout]:
        tasks = tag_tasks(self.val_tasks, run=self.run_name, step=step, phase="val")
        return session.run(tasks, Sampling(0.0, 1.0, self.cfg.max_tokens), label=f"val @ {step}")

    def _record_val(self, step: int, out: list[Rollout], metrics: MetricsWriter) -> float:
        score = summarize_scores(out, self.credit, failed_as=0.0)
        metrics.write(
            step,
            {
                "val/reward_mean": score.mean,
                "val/reward_std": score.std,
                "val/failed": float(score.failed),
                "val/tasks": float(len(out)),
            },
        )
        if out and score.failed == len(out):
            note = " (all failed)"
        elif score.failed:
            note = f" ({score.failed} failed, scored 0)"
        else:
            note = ""
        shown = "n/a" if out and score.failed == len(out) else f"{score.mean:.3f}"
        self.reporter.line(f"val @ step {step}: reward {shown} over {len(out)} tasks{note}")
        return score.mean

    # -- checkpoints ----------------------------------------------------------------

    def _checkpoint(
        self, trainer: TrainingBackend, step: int, history: list[tuple[int, float]]
    ) -> Path:
        final = self.out / "checkpoints" / f"step-{step:06d}"
        tmp = final.with_name(final.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        trainer.save(tmp)
        state = {
            "step": step,
            "policy_version": trainer.policy_version,
            "val_history": history,
            "baseline": self.baseline.value,
            "counters": self.counters,
            "config": self.cfg.model_dump(mode="json"),
        }
        (tmp / "state.json").write_text(json.dumps(state, indent=2))
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)  # a crash never leaves a half-written checkpoint under its name
        (self.out / "checkpoints" / "latest").write_text(final.name)
        return final

    def _resume(
        self, trainer: TrainingBackend, server: PolicyServer, store: Store
    ) -> tuple[int, list[tuple[int, float]]]:
        latest = self.out / "checkpoints" / "latest"
        if not latest.is_file():
            raise InvalidInput(f"--resume: no checkpoint in {self.out / 'checkpoints'}")
        path = self.out / "checkpoints" / latest.read_text().strip()
        state = json.loads((path / "state.json").read_text())
        with weight_swap(server, trainer):
            trainer.load(path, policy_version=int(state["policy_version"]))
        b = state.get("baseline")
        self.baseline.value = None if b is None else float(b)
        self.counters.update(state.get("counters", {}))
        # rollouts a crashed run left unfinished would only waste the runners' time
        for status in (RolloutStatus.QUEUED, RolloutStatus.REQUEUED, RolloutStatus.RUNNING):
            for r in store.query(status=status, limit=100_000):
                store.cancel(r.id)
        self.reporter.line(
            f"resumed from {path} (step {state['step']}, policy version {state['policy_version']})"
        )
        return int(state["step"]), [tuple(x) for x in state.get("val_history", [])]


def _shaping_only_groups(
    rollouts: list[Rollout], trans: list[Transition], keep: list[bool], credit: CreditConfig
) -> int:
    """Groups the update learns from although their rollouts' final rewards are all equal:
    their returns differ only by intermediate rewards (``boltrl.emit_reward``),
    so with std-normalized advantages a 0.1 bonus difference trains as hard as success
    against failure. Many such groups mean the step teaches collecting the shaping rewards,
    not finishing the task (rag_agent's searches past the answer: its README)."""
    final = {r.id: final_reward(r, credit) for r in rollouts}
    finals: dict[str, set[float | None]] = {}
    trained: set[str] = set()
    for t, k in zip(trans, keep, strict=True):
        finals.setdefault(t.group, set()).add(final.get(t.rollout_id))
        if k:
            trained.add(t.group)
    return sum(1 for g in trained if len(finals[g]) == 1)
