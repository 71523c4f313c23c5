"""The warm start: demonstrations -> supervised fine-tuning -> a checkpoint, before RL.

Read top to bottom: validate the base model (optional) -> collect demonstrations through
the real agent (``demonstrations.collect``) -> ``epochs`` passes of NLL on their action
tokens in shuffled batches (``sft.SFTBackend``), generation paused, the served policy
version bumped once -> a checkpoint in the RL format under ``{out_dir}/warm_start`` ->
(``boltrl sft``) validate again. Metrics go to ``{out_dir}/warm_start/metrics.jsonl`` (and
TensorBoard beside it): ``demo/*`` once, ``sft/*`` per optimizer step, ``val/*``.

``boltrl train`` calls ``prepare_policy`` before its RL loop: it loads ``init_from`` and
runs the configured warm start on the model the RL loop then trains. ``boltrl sft``
calls ``run_sft``.
"""

from __future__ import annotations

import json
import logging
import random
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from boltrl.credit import CreditConfig
from boltrl.errors import InvalidInput
from boltrl.loading import load_object
from boltrl.records import Task
from boltrl.runner import AgentFn
from boltrl.scoring import summarize_scores
from boltrl.store import open_store
from boltrl.store.base import Store
from boltrl_trainer.config import TrainConfig
from boltrl_trainer.demonstrations import Demonstrations, collect
from boltrl_trainer.malloc_tuning import tune_malloc
from boltrl_trainer.metrics import MetricsWriter
from boltrl_trainer.reporting import LogReporter, Reporter
from boltrl_trainer.seams import weight_swap
from boltrl_trainer.session import RolloutSession, Sampling, tag_tasks
from boltrl_trainer.sft import SFTBackend
from boltrl_trainer.tasks import load_tasks
from boltrl_trainer.warm_start_config import WarmStartConfig

log = logging.getLogger(__name__)

__all__ = ["WarmStartResult", "checkpoint_path", "load_init", "prepare_policy", "run_sft"]


@dataclass
class WarmStartResult:
    """What a warm start produced."""

    demonstrations: dict[str, float]
    """``demo/*`` counts (rollouts, kept, failed, rejected, transitions, tokens)."""
    steps: int = 0
    """Optimizer steps."""
    losses: list[float] = field(default_factory=list)
    """``sft/loss`` of every step, in order."""
    val_before: float | None = None
    val_after: float | None = None
    checkpoint: Path | None = None
    policy_version: int = 0
    out_dir: Path = Path(".")
    seconds: float = 0.0


def checkpoint_path(path: str | Path) -> Path:
    """A checkpoint folder from what a user may name: the folder itself, a ``checkpoints``
    folder or a run folder (their ``latest``). Raises ``InvalidInput`` naming ``init_from``."""
    p = Path(path)
    for cand in (p, p / "checkpoints"):
        if (cand / "trainable.safetensors").is_file():
            return cand
        latest = cand / "latest"
        if latest.is_file():
            found = cand / latest.read_text().strip()
            if (found / "trainable.safetensors").is_file():
                return found
    raise InvalidInput(
        f"init_from: {p} holds no boltrl checkpoint (a folder with trainable.safetensors, "
        "or a run/checkpoints folder with a 'latest' file)"
    )


def load_init(model: Any, path: str | Path) -> int:
    """Copy a checkpoint's trainable weights into ``model``; returns its policy version."""
    from boltrl_trainer.update import load_trainable

    ckpt = checkpoint_path(path)
    try:
        load_trainable(model, ckpt)
    except ValueError as e:
        raise InvalidInput(
            f"init_from: {e} (are the lora settings those it was saved with?)"
        ) from None
    state_file = ckpt / "state.json"
    state = json.loads(state_file.read_text()) if state_file.is_file() else {}
    version = int(state.get("policy_version", 0))
    log.info("initialized from %s (policy version %d)", ckpt, version)
    return version


def _eos_ids(model: Any, tokenizer: Any) -> list[int]:
    """The ids a student reply ends on: what ``TransformersBackend`` stops generating at."""
    ids: set[int] = set()
    gen_cfg = getattr(model, "generation_config", None)
    for value in (getattr(gen_cfg, "eos_token_id", None), tokenizer.eos_token_id):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list | tuple):
            ids.update(int(v) for v in value)
    return sorted(ids)


def _validate(
    cfg: TrainConfig,
    agent: AgentFn,
    backend: Any,
    store: Store,
    tasks: list[Task],
    label: str,
    reporter: Reporter,
) -> float:
    """Greedy mean reward on ``tasks`` (a failed rollout scores 0, as in RL validation)."""
    sampling = Sampling(0.0, 1.0, cfg.max_tokens)
    session = RolloutSession.for_config(cfg, agent, backend, store, sampling, reporter=reporter)
    tagged = tag_tasks(tasks, run="warm_start", step=0, phase="val")
    with session:
        out = session.run(tagged, sampling, label=label)
    mean = summarize_scores(out, CreditConfig.from_dict(cfg.credit), failed_as=0.0).mean
    reporter.line(f"warm start {label}: reward {mean:.3f} over {len(out)} tasks")
    return mean


def _save(sft: SFTBackend, out: Path, step: int, state: dict[str, Any]) -> Path:
    final = out / "checkpoints" / f"step-{step:06d}"
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    sft.save(tmp)
    (tmp / "state.json").write_text(json.dumps({"step": step, **state}, indent=2))
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)  # never a half-written checkpoint under its name
    (out / "checkpoints" / "latest").write_text(final.name)
    return final


def _train(
    cfg: TrainConfig,
    ws: WarmStartConfig,
    demos: Demonstrations,
    sft: SFTBackend,
    metrics: MetricsWriter,
    result: WarmStartResult,
    reporter: Reporter,
) -> None:
    items = demos.transitions
    rng = random.Random(cfg.seed)
    per_epoch = -(-len(items) // ws.batch_size)
    for epoch in range(ws.epochs):
        order = list(range(len(items)))
        rng.shuffle(order)
        for b in range(per_epoch):
            batch = [items[i] for i in order[b * ws.batch_size : (b + 1) * ws.batch_size]]
            t0 = time.perf_counter()
            row = sft.step(batch)
            result.steps += 1
            result.losses.append(row["sft/loss"])
            row.update({"sft/epoch": float(epoch + 1), "time/step_s": time.perf_counter() - t0})
            metrics.write(result.steps, row)
            reporter.line(
                f"warm start step {result.steps:>3}/{per_epoch * ws.epochs} (epoch {epoch + 1})"
                f" | loss {row['sft/loss']:.4f} | {row['sft/tokens']:.0f} tokens"
                f" | {row['time/step_s']:.1f}s"
            )


def warm_start(
    cfg: TrainConfig,
    *,
    agent: AgentFn,
    model: Any,
    tokenizer: Any,
    backend: Any,
    store: Store,
    out_dir: Path,
    validate_after: bool,
    reporter: Reporter | None = None,
) -> WarmStartResult:
    """Run ``cfg.warm_start`` on ``model``, which ``backend`` (a ``TransformersBackend``)
    serves; its policy version goes up by one. Raises ``InvalidInput`` when no
    demonstration survives (nothing to train on)."""
    rep: Reporter = reporter or LogReporter()
    ws = cfg.warm_start
    if ws is None:
        raise InvalidInput("warm_start: the config has no warm_start section")
    t0 = time.perf_counter()
    out = out_dir / "warm_start"
    out.mkdir(parents=True, exist_ok=True)
    val_tasks: list[Task] = []
    if cfg.tasks.val is not None:
        val_tasks = load_tasks(cfg.tasks.val, split="val")[: cfg.tasks.limit_val]
    result = WarmStartResult({}, out_dir=out, policy_version=backend.policy_version)
    metrics = MetricsWriter(
        out,
        report_to=cfg.report_to,
        run_name=f"{out_dir.name}-warm_start",
        config=cfg.model_dump(mode="json"),
    )
    try:
        if ws.validate_before and val_tasks:
            result.val_before = _validate(cfg, agent, backend, store, val_tasks, "val before", rep)
            metrics.write(0, {"val/reward_mean": result.val_before})
        demos = collect(
            cfg,
            ws,
            agent=agent,
            tokenizer=tokenizer,
            store=store,
            eos_ids=_eos_ids(model, tokenizer),
            reporter=rep,
        )
        result.demonstrations = demos.stats()
        metrics.write(0, result.demonstrations)
        if not demos.transitions:
            raise InvalidInput(
                f"warm_start: no demonstrations from {demos.source} ({demos.rollouts} "
                f"rollouts: {demos.failed} failed, {demos.rejected} rejected by min_reward); "
                "see the log for why"
            )
        pad = tokenizer.pad_token_id
        if pad is None:
            pad = tokenizer.eos_token_id
        sft = SFTBackend(
            model,
            lr=ws.lr,
            pad_id=int(pad),
            token_budget=ws.token_budget or cfg.optim.token_budget,
            grad_clip=ws.grad_clip,
            weight_decay=cfg.optim.weight_decay,
        )
        version = int(backend.policy_version) + 1
        with backend.paused():  # no generation while the served weights change
            _train(cfg, ws, demos, sft, metrics, result, rep)
            backend.set_policy_version(version)
        result.policy_version = version
        result.checkpoint = _save(
            sft,
            out,
            result.steps,
            {
                "kind": "warm_start",
                "policy_version": version,
                "demonstrations": result.demonstrations,
                "losses": result.losses,
                "val_history": [[0, result.val_before]] if result.val_before is not None else [],
                "config": cfg.model_dump(mode="json"),
            },
        )
        if validate_after and val_tasks:
            result.val_after = _validate(cfg, agent, backend, store, val_tasks, "val after", rep)
            metrics.write(result.steps, {"val/reward_mean": result.val_after})
    finally:
        metrics.close()
    result.seconds = time.perf_counter() - t0
    rep.line(
        f"warm start done in {result.seconds:.0f}s: {result.steps} steps, loss "
        f"{result.losses[0]:.4f} -> {result.losses[-1]:.4f}, checkpoint {result.checkpoint}"
    )
    return result


def prepare_policy(
    cfg: TrainConfig,
    *,
    agent: AgentFn,
    server: Any,
    trainer: Any,
    store: Store,
    out_dir: Path,
    reporter: Reporter | None = None,
) -> WarmStartResult | None:
    """Before RL (``boltrl train``): load ``init_from``, then run the warm start if
    configured, on the model ``server`` (a ``TransformersBackend``) serves and ``trainer``
    (a ``TorchTrainingBackend``) trains. Afterwards ``trainer`` holds the same weights
    with a fresh optimizer and reports the version now served. Returns the warm start's
    result (None without one). Raises ``InvalidInput`` for another backend than torch."""
    if cfg.backend != "torch":
        raise InvalidInput("warm_start / init_from: the torch backend only (backend: torch)")
    if cfg.init_from is not None:
        server.set_policy_version(load_init(server.model, cfg.init_from))
    result = None
    if cfg.warm_start is not None:
        result = warm_start(
            cfg,
            agent=agent,
            model=server.model,
            tokenizer=server.tokenizer,
            backend=server,
            store=store,
            out_dir=out_dir,
            validate_after=False,  # the RL loop's step-0 validation measures it
            reporter=reporter,
        )
    # Through the training backend's own save/load: the weights it trains are the ones
    # just served, its optimizer state stays fresh, and its version follows the server's.
    handoff = out_dir / "warm_start" / "rl_start.tmp"
    shutil.rmtree(handoff, ignore_errors=True)
    try:
        with weight_swap(server, trainer):
            trainer.save(handoff)
            trainer.load(handoff, policy_version=int(server.policy_version))
    finally:
        shutil.rmtree(handoff, ignore_errors=True)
    return result


def run_sft(cfg: TrainConfig, *, reporter: Reporter | None = None) -> WarmStartResult:
    """``boltrl sft``: ``init_from`` (if set), then the warm start, validated before and
    after; the checkpoint lands in ``{out_dir}/warm_start/checkpoints``."""
    import torch

    from boltrl_trainer.policy import load_policy, serve_policy

    if cfg.warm_start is None:
        raise InvalidInput(
            "warm_start: boltrl sft needs a warm_start section (at least teacher: ...)"
        )
    if cfg.backend != "torch":
        raise InvalidInput("backend: boltrl sft runs on the torch backend only")
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    tune_malloc()  # as Trainer.run: the SFT steps' freed activations go back to the OS
    agent = load_object(cfg.agent, what="agent")
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model, tok = load_policy(cfg)
    backend = serve_policy(cfg, model, tok)
    store = open_store(cfg.store_url)
    try:
        if cfg.init_from is not None:
            backend.set_policy_version(load_init(model, cfg.init_from))
        return warm_start(
            cfg,
            agent=agent,
            model=model,
            tokenizer=tok,
            backend=backend,
            store=store,
            out_dir=out,
            validate_after=True,
            reporter=reporter,
        )
    finally:
        backend.close()
        store.close()
