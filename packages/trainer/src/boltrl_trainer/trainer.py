"""The training loop of ``boltrl train``: read top to bottom.

setup: the registry entry of ``cfg.backend`` (checked) builds a policy server and a
       training backend (``boltrl_trainer.seams``) → store → gateway + runners (a session).
step:  enqueue batch_tasks x group_size rollouts → wait → transitions (credit
       assignment) → advantages → update inside ``weight_swap`` (generation paused)
       → policy version + 1.
every val_every steps: held-out tasks at temperature 0. Checkpoints and ``resume``.
Each phase reports one line per distinct error of its failed rollouts; a step whose
every rollout failed stops the run (``failures.AllRolloutsFailed``): there is nothing
to train on, and the next step would fail the same way.
Rewards are reported as ``boltrl.scoring`` scores: the return training uses.
"""

from __future__ import annotations

import json
import logging
import random
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from boltrl.credit import CreditConfig, MissingTokenIds, transitions
from boltrl.errors import InvalidInput
from boltrl.loading import load_object
from boltrl.records import Rollout, RolloutStatus, Task, Transition
from boltrl.scoring import summarize_scores
from boltrl.store import open_store
from boltrl.store.base import Store
from boltrl_trainer.algorithms import RunningBaseline, compute_advantages, make_config
from boltrl_trainer.backends import backend_for
from boltrl_trainer.config import TrainConfig
from boltrl_trainer.failures import AllRolloutsFailed, failure_lines
from boltrl_trainer.lineage import run_lineage
from boltrl_trainer.malloc_tuning import tune_malloc
from boltrl_trainer.metrics import MetricsWriter, plot_rewards
from boltrl_trainer.reporting import LogReporter, Reporter
from boltrl_trainer.seams import PolicyServer, TrainBatch, TrainingBackend, weight_swap
from boltrl_trainer.session import RolloutSession, Sampling, tag_tasks
from boltrl_trainer.tasks import load_tasks

log = logging.getLogger(__name__)


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
                for step in range(start_step + 1, cfg.steps + 1):
                    self._step(session, server, trainer, step, metrics, train_sampling)
                    last = step == cfg.steps
                    if self.val_tasks and (last or (cfg.val_every and step % cfg.val_every == 0)):
                        history.append((step, self._validate(session, step, metrics)))
                    if last or (cfg.checkpoint_every and step % cfg.checkpoint_every == 0):
                        self._checkpoint(trainer, step, history)
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

    def _step(
        self,
        session: RolloutSession,
        server: PolicyServer,
        trainer: TrainingBackend,
        step: int,
        metrics: MetricsWriter,
        sampling: Sampling,
    ) -> None:
        cfg = self.cfg
        t_step = time.perf_counter()
        rng = random.Random(f"{cfg.seed}-{step}")  # resumable: tasks depend on step only
        chosen = rng.sample(self.train_tasks, min(cfg.batch_tasks, len(self.train_tasks)))
        tasks = tag_tasks(
            chosen, run=self.run_name, step=step, phase="train", repeat=cfg.group_size
        )
        busy0 = session.backend.busy_s
        tokens0 = server.stats().get("completion_tokens", 0)
        label = f"step {step}/{cfg.steps}"
        rollouts = session.run(tasks, sampling, label=label)
        t_rollout = time.perf_counter() - t_step
        if rollouts and all(r.status != RolloutStatus.SUCCEEDED for r in rollouts):
            # nothing to train on, and every later step would fail the same way
            raise AllRolloutsFailed(
                "\n".join(
                    [
                        f"{label}: every rollout failed; nothing to train on, stopping",
                        *failure_lines(label, rollouts)[1:],
                    ]
                )
            )
        generation_s = session.backend.busy_s - busy0

        t_prep = time.perf_counter()
        batch, stats = self._batch(rollouts, trainer.policy_version, sampling.temperature)
        prep_s = time.perf_counter() - t_prep
        with weight_swap(server, trainer):
            upd = trainer.update(batch)
        session.publish()
        step_s = time.perf_counter() - t_step
        gen = server.stats()
        row = {
            **stats,
            **upd,
            "policy_version": trainer.policy_version,
            "time/step_s": step_s,
            "time/rollout_s": t_rollout,
            "time/generation_s": generation_s,
            "time/prepare_s": prep_s,
            # everything that is neither generating nor updating: store, gateway, agents,
            # runners, credit assignment, batching
            "time/overhead_s": max(step_s - generation_s - upd.get("time/update_s", 0.0), 0.0),
            "throughput/completion_tokens_total": gen.get("completion_tokens", 0),
            "throughput/tokens_per_s": (gen.get("completion_tokens", 0) - tokens0)
            / max(t_rollout, 1e-9),
            "throughput/rollouts_per_s": len(rollouts) / max(t_rollout, 1e-9),
        }
        metrics.write(step, row)
        self.reporter.line(
            f"step {step:>3} | reward {stats['train/reward_mean']:.3f} ± "
            f"{stats['train/reward_std']:.3f} | loss {upd.get('update/loss', 0.0):+.4f} "
            f"| kl {upd.get('update/approx_kl', 0.0):.4f} "
            f"| clip {upd.get('update/clip_frac', 0.0):.3f}"
            f" | failed {stats['train/failed']:.0f} skipped {stats['train/skipped_groups']:.0f}"
            f" | {t_rollout:.1f}s rollout + {upd.get('time/update_s', 0.0):.1f}s update"
        )

    def _batch(
        self, rollouts: list[Rollout], version: int, temperature: float
    ) -> tuple[TrainBatch, dict[str, float]]:
        """Transitions and advantages of the succeeded rollouts (failed ones are dropped
        and counted, not scored 0)."""
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
        score = summarize_scores(ok, self.credit)
        stats: dict[str, float] = {
            "train/reward_mean": score.mean,
            "train/reward_std": score.std,
            "train/rollouts": float(len(rollouts)),
            "train/failed": float(failed),
            "train/refused": float(refused),
            "train/transitions": float(len(trans)),
            "train/skipped_groups": 0.0,
        }
        if not trans:
            return TrainBatch([], [], version, temperature), stats
        adv = compute_advantages(trans, None, self.algo, running=self.baseline)
        keep = adv.keep.tolist()
        stats["train/skipped_groups"] = adv.stats.get("skipped_groups", 0.0)
        stats["train/advantage_abs_mean"] = float(adv.advantages.abs().mean())
        kept = [t for t, k in zip(trans, keep, strict=True) if k]
        values = [a for a, k in zip(adv.advantages.tolist(), keep, strict=True) if k]
        return TrainBatch(kept, values, version, temperature, [t.group for t in kept]), stats

    def _validate(self, session: RolloutSession, step: int, metrics: MetricsWriter) -> float:
        cfg = self.cfg
        tasks = tag_tasks(self.val_tasks, run=self.run_name, step=step, phase="val")
        out = session.run(tasks, Sampling(0.0, 1.0, cfg.max_tokens), label=f"val @ {step}")
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
