"""The training loop of ``boltrl train`` (torch backend): read top to bottom.

setup: model (+ LoRA) → TransformersBackend → store → gateway + runners (a session).
step:  enqueue batch_tasks x group_size rollouts → wait → transitions (credit
       assignment) → advantages → update (generation paused) → policy version + 1.
every val_every steps: held-out tasks at temperature 0. Checkpoints and ``resume``.
"""

from __future__ import annotations

import json
import logging
import math
import random
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from boltrl.credit import CreditConfig, MissingTokenIds, transitions
from boltrl.errors import InvalidInput
from boltrl.loading import load_object
from boltrl.records import Rollout, RolloutStatus, Task, Transition
from boltrl.store import open_store
from boltrl_trainer.algorithms import RunningBaseline, compute_advantages, make_config
from boltrl_trainer.config import TrainConfig
from boltrl_trainer.metrics import MetricsWriter, plot_rewards
from boltrl_trainer.session import RolloutSession, Sampling, tag_tasks
from boltrl_trainer.tasks import load_tasks
from boltrl_trainer.update import TorchTrainingBackend, TrainBatch, apply_lora

if TYPE_CHECKING:
    from boltrl_trainer.verl.backend import VerlTrainingBackend

log = logging.getLogger(__name__)


@dataclass
class TrainResult:
    """What a training run produced."""

    steps_done: int
    val_history: list[tuple[int, float]] = field(default_factory=list)
    """(step, mean val reward) pairs, step 0 = before training."""
    out_dir: Path = Path(".")
    plot: Path | None = None

    @property
    def val_before(self) -> float | None:
        return self.val_history[0][1] if self.val_history else None

    @property
    def val_after(self) -> float | None:
        return self.val_history[-1][1] if self.val_history else None


def _mean_std(xs: list[float]) -> tuple[float, float]:
    if not xs:
        return 0.0, 0.0
    m = sum(xs) / len(xs)
    return m, math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))


def pick_device(name: str) -> str:
    if name != "auto":
        return name
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def load_policy(cfg: TrainConfig) -> tuple[Any, Any]:
    """The model (with LoRA when configured) and its tokenizer."""
    import torch

    from boltrl_trainer.models import load_model

    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    model, tok = load_model(cfg.model, device=pick_device(cfg.device), dtype=dtype[cfg.dtype])
    if cfg.lora is not None:
        model = apply_lora(model, cfg.lora)
    model.train(False)  # inference mode until an update
    return model, tok


class Trainer:
    """One ``boltrl train`` run. Use ``Trainer(cfg).run(resume=...)``."""

    def __init__(self, cfg: TrainConfig, *, run_name: str | None = None) -> None:
        if cfg.backend == "verl":
            from boltrl_trainer.verl import require_verl

            require_verl()  # says how to install verl and vLLM when they are missing
        if cfg.tasks.train is None:
            raise InvalidInput("tasks.train: required for training (a .jsonl file or module:fn)")
        if cfg.steps > 0 and not cfg.temperature > 0:
            raise InvalidInput(
                "temperature: must be > 0 for training rollouts (validation always uses 0)"
            )
        self.cfg = cfg
        self.out = Path(cfg.out_dir)
        self.run_name = run_name or self.out.name
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

        from boltrl_trainer.serving import TransformersBackend

        cfg = self.cfg
        self.out.mkdir(parents=True, exist_ok=True)
        random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)
        t0 = time.perf_counter()
        backend: Any
        trainer: TorchTrainingBackend | VerlTrainingBackend
        if cfg.backend == "verl":  # verl's FSDP actor on Ray; its vLLM servers serve rollouts
            from boltrl_trainer.verl.backend import build_verl

            backend, trainer = build_verl(cfg)
        else:
            model, tok = load_policy(cfg)
            backend = TransformersBackend(
                model,
                tok,
                max_batch=max(cfg.concurrency, 1),
                batch_window_s=0.02,
                max_tokens=cfg.max_tokens,
                model_name="policy",
                seed=cfg.seed,
            )
            pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
            trainer = TorchTrainingBackend(model, self.algo, cfg.optim, pad_id=int(pad))
        store = open_store(cfg.store_url)
        start_step, history = 0, list[tuple[int, float]]()
        if resume:
            start_step, history = self._resume(trainer, backend, store)
        n_params = sum(p.numel() for p in getattr(trainer, "params", []))  # none for verl
        log.info(
            "model ready in %.1fs (%s)",
            time.perf_counter() - t0,
            f"{n_params} trainable params" if n_params else f"backend {cfg.backend}",
        )
        metrics = MetricsWriter(self.out)
        train_sampling = Sampling(cfg.temperature, cfg.top_p, cfg.max_tokens)
        session = RolloutSession(
            self.agent,
            backend,
            store,
            concurrency=cfg.concurrency,
            default_sampling=train_sampling,
            timeout_s=cfg.rollout_timeout_s,
            max_attempts=cfg.max_attempts,
            progress=cfg.progress,
        )
        try:
            with session:
                if not history and self.val_tasks:
                    history.append((0, self._validate(session, 0, metrics)))
                step = start_step
                for step in range(start_step + 1, cfg.steps + 1):
                    self._step(session, backend, trainer, step, metrics, train_sampling)
                    last = step == cfg.steps
                    if self.val_tasks and (last or (cfg.val_every and step % cfg.val_every == 0)):
                        history.append((step, self._validate(session, step, metrics)))
                    if last or (cfg.checkpoint_every and step % cfg.checkpoint_every == 0):
                        self._checkpoint(trainer, step, history)
        finally:
            metrics.close()
            backend.close()
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
        backend: Any,
        trainer: TorchTrainingBackend | VerlTrainingBackend,
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
        tokens0 = backend.stats().get("completion_tokens", 0)
        rollouts = session.run(tasks, sampling, label=f"step {step}/{cfg.steps}")
        t_rollout = time.perf_counter() - t_step
        generation_s = session.backend.busy_s - busy0

        t_prep = time.perf_counter()
        batch, stats = self._batch(rollouts, trainer.policy_version, sampling.temperature)
        prep_s = time.perf_counter() - t_prep
        with backend.update_weights():
            upd, version = trainer.update(batch)
        session.publish()
        step_s = time.perf_counter() - t_step
        gen = backend.stats()
        row = {
            **stats,
            **upd,
            "policy_version": version,
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
        print(
            f"step {step:>3} | reward {stats['train/reward_mean']:.3f} ± "
            f"{stats['train/reward_std']:.3f} | loss {upd.get('update/loss', 0.0):+.4f} "
            f"| kl {upd.get('update/approx_kl', 0.0):.4f} "
            f"| clip {upd.get('update/clip_frac', 0.0):.3f}"
            f" | failed {stats['train/failed']:.0f} skipped {stats['train/skipped_groups']:.0f}"
            f" | {t_rollout:.1f}s rollout + {upd.get('time/update_s', 0.0):.1f}s update",
            flush=True,
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
        rewards = [r.reward or 0.0 for r in ok]
        mean, std = _mean_std(rewards)
        stats: dict[str, float] = {
            "train/reward_mean": mean,
            "train/reward_std": std,
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
        rewards = [r.reward or 0.0 if r.status == RolloutStatus.SUCCEEDED else 0.0 for r in out]
        mean, std = _mean_std(rewards)
        failed = sum(r.status != RolloutStatus.SUCCEEDED for r in out)
        metrics.write(
            step,
            {
                "val/reward_mean": mean,
                "val/reward_std": std,
                "val/failed": float(failed),
                "val/tasks": float(len(out)),
            },
        )
        print(
            f"val @ step {step}: reward {mean:.3f} over {len(out)} tasks"
            + (f" ({failed} failed, scored 0)" if failed else ""),
            flush=True,
        )
        return mean

    # -- checkpoints ----------------------------------------------------------------

    def _checkpoint(
        self,
        trainer: TorchTrainingBackend | VerlTrainingBackend,
        step: int,
        history: list[tuple[int, float]],
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
        self, trainer: TorchTrainingBackend | VerlTrainingBackend, backend: Any, store: Any
    ) -> tuple[int, list[tuple[int, float]]]:
        latest = self.out / "checkpoints" / "latest"
        if not latest.is_file():
            raise InvalidInput(f"--resume: no checkpoint in {self.out / 'checkpoints'}")
        path = self.out / "checkpoints" / latest.read_text().strip()
        state = json.loads((path / "state.json").read_text())
        trainer.load(path)
        trainer.set_version(int(state["policy_version"]))
        backend.set_policy_version(int(state["policy_version"]))
        b = state.get("baseline")
        self.baseline.value = None if b is None else float(b)
        self.counters.update(state.get("counters", {}))
        # rollouts a crashed run left unfinished would only waste the runners' time
        for status in (RolloutStatus.QUEUED, RolloutStatus.REQUEUED, RolloutStatus.RUNNING):
            for r in store.query(status=status, limit=100_000):
                store.cancel(r.id)
        print(
            f"resumed from {path} (step {state['step']}, policy version {state['policy_version']})",
            flush=True,
        )
        return int(state["step"]), [tuple(x) for x in state.get("val_history", [])]
