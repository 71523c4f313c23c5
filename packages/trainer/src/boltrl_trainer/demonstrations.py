"""Collecting demonstrations: training tasks -> the real agent with a teacher -> transitions.

``collect`` runs the warm start's tasks through the user's agent and the real gateway with
a ``TeacherBackend`` in the student's place (a teacher function or a teacher model), or
reads the policy's own successful rollouts from a store (expert iteration). Rollouts
whose reward misses ``min_reward`` are rejected; the rest become transitions through the
run's own credit settings (its ``agents`` filter included), so the warm start trains the
calls that RL would. Demonstrations are always prefix-merged (``merge_prefix``): a
multi-turn episode whose every prompt extends the previous prompt + reply becomes one
sequence with the observations masked out. The SFT loss is a mean over trained tokens,
and each reply's tokens see exactly the context they would see alone, so the loss is
the same while the prompt is run once instead of once per call (rag_agent's three
calls: about half the tokens).

Teachers see training tasks only: ``training_tasks`` refuses a warm start whose tasks
overlap the config's val/test tasks (by id or by input), and the ``TaskGuard`` of the
teacher backend refuses, call by call, any rollout whose task is not one of them.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from boltrl.credit import CreditConfig, MissingTokenIds, transitions
from boltrl.errors import InvalidInput
from boltrl.loading import load_object
from boltrl.records import Rollout, RolloutStatus, Task, Transition
from boltrl.runner import AgentFn
from boltrl.scoring import rollout_score
from boltrl.store import open_store
from boltrl.store.base import Store
from boltrl_trainer import _chat
from boltrl_trainer.config import TrainConfig
from boltrl_trainer.reporting import Reporter
from boltrl_trainer.session import RolloutSession, Sampling, tag_tasks
from boltrl_trainer.tasks import load_tasks
from boltrl_trainer.teacher_backend import (
    FunctionTeacher,
    ModelTeacher,
    StudentRenderer,
    TaskGuard,
    Teacher,
    TeacherBackend,
)
from boltrl_trainer.warm_start_config import (
    TeacherModelConfig,
    TeacherStoreConfig,
    WarmStartConfig,
)

log = logging.getLogger(__name__)

__all__ = ["Demonstrations", "collect", "make_teacher", "training_tasks"]


@dataclass
class Demonstrations:
    """What ``collect`` produced."""

    transitions: list[Transition]
    source: str
    """The teacher (``function:…``, ``model:…``, ``store:…``)."""
    rollouts: int = 0
    """Rollouts run (or read)."""
    kept: int = 0
    """Rollouts whose transitions were kept."""
    failed: int = 0
    """Rollouts that did not succeed (a teacher without a reply, an agent error)."""
    rejected: int = 0
    """Succeeded rollouts below ``min_reward`` (or refused for their tokens)."""
    rewards: list[float] = field(default_factory=list)
    """Rewards of the kept rollouts."""

    def stats(self) -> dict[str, float]:
        n = len(self.rewards)
        return {
            "demo/rollouts": float(self.rollouts),
            "demo/kept": float(self.kept),
            "demo/failed": float(self.failed),
            "demo/rejected": float(self.rejected),
            "demo/transitions": float(len(self.transitions)),
            "demo/tokens": float(sum(sum(t.action_mask) for t in self.transitions)),
            "demo/reward_mean": sum(self.rewards) / n if n else 0.0,
        }


def _key(task: Task) -> str:
    return json.dumps(task.input, sort_keys=True, default=str)


def training_tasks(cfg: TrainConfig, ws: WarmStartConfig) -> list[Task]:
    """The warm start's tasks (``warm_start.tasks`` or ``tasks.train``, first ``limit``),
    split ``train``. Raises ``InvalidInput`` when there are none or any is also a val/test
    task: teachers see training tasks only."""
    source = ws.tasks or cfg.tasks.train
    if source is None:
        raise InvalidInput("warm_start.tasks: not set, and neither is tasks.train")
    tasks = load_tasks(source, split="train")[: ws.limit]
    held_out: dict[str, str] = {}
    for split in ("val", "test"):
        src = getattr(cfg.tasks, split)
        if src is None:
            continue
        if src == source:
            raise InvalidInput(
                f"warm_start.tasks: is tasks.{split} ({src}); teachers see training tasks only"
            )
        for t in load_tasks(src, split=split):
            held_out[t.id] = split
            held_out[_key(t)] = split
    clash = [t for t in tasks if t.id in held_out or _key(t) in held_out]
    if clash:
        t = clash[0]
        split = held_out.get(t.id) or held_out[_key(t)]
        raise InvalidInput(
            f"warm_start.tasks: {len(clash)} task(s) are also {split} tasks (e.g. {t.id!r}); "
            "teachers see training tasks only"
        )
    return tasks


def make_teacher(ws: WarmStartConfig) -> Teacher:
    """The teacher of a function or model ``warm_start.teacher``."""
    spec = ws.teacher
    if isinstance(spec, str):
        fn = load_object(spec, what="warm_start.teacher")
        if not callable(fn):
            raise InvalidInput(f"warm_start.teacher: {spec!r} is not a function")
        path, _, name = spec.rpartition(":")
        return FunctionTeacher(fn, f"function:{path.rsplit('/', 1)[-1]}:{name}")
    if isinstance(spec, TeacherModelConfig):
        from boltrl.gateway.upstream import UpstreamBackend

        upstream = UpstreamBackend(
            spec.base_url,
            spec.model,
            spec.api_key,
            timeout_s=spec.timeout_s,
            request_token_ids=False,  # the teacher's own ids mean nothing to the student
        )
        return ModelTeacher(upstream, f"model:{spec.model}@{spec.base_url}")
    raise InvalidInput("warm_start.teacher: a store is read, not played (see collect)")


def _keep(
    rollouts: Sequence[Rollout], ws: WarmStartConfig, credit: CreditConfig, out: Demonstrations
) -> None:
    for r in rollouts:
        out.rollouts += 1
        if r.status != RolloutStatus.SUCCEEDED:
            out.failed += 1
            continue
        # the rollout's score is the return training uses (an agent that only calls
        # ``emit_reward`` has no final ``reward``): one definition, ``boltrl.scoring``
        score = rollout_score(r, credit) or 0.0
        if ws.min_reward is not None and score < ws.min_reward:
            out.rejected += 1
            continue
        try:
            trans = transitions(r, credit, merge_prefix=True)
        except MissingTokenIds as e:
            log.error("rollout %s: not a usable demonstration: %s", r.id, e)
            out.rejected += 1
            continue
        if not trans:
            out.rejected += 1
            continue
        out.kept += 1
        out.rewards.append(score)
        out.transitions.extend(trans)


def collect(
    cfg: TrainConfig,
    ws: WarmStartConfig,
    *,
    agent: AgentFn,
    tokenizer: Any,
    store: Store,
    eos_ids: Sequence[int] = (),
    run_name: str = "warm_start",
    reporter: Reporter | None = None,
) -> Demonstrations:
    """Demonstrations for the warm start (see the module docstring). Blocks while the
    agent runs; shows its progress on ``reporter``."""
    tasks = training_tasks(cfg, ws)
    credit = CreditConfig.from_dict(cfg.credit)
    if isinstance(ws.teacher, TeacherStoreConfig):
        return _from_store(ws, ws.teacher, tasks, credit, tokenizer)
    teacher = make_teacher(ws)
    guard = TaskGuard(store, [t.id for t in tasks])
    backend = TeacherBackend(teacher, StudentRenderer(tokenizer, eos_ids), guard)
    sampling = Sampling(ws.temperature, 1.0, cfg.max_tokens)
    session = RolloutSession.for_config(cfg, agent, backend, store, sampling, reporter=reporter)
    out = Demonstrations([], teacher.source)
    tagged = tag_tasks(tasks, run=run_name, step=0, phase="warm_start", repeat=ws.repeats)
    with session:
        rollouts = session.run(tagged, sampling, label="demonstrations")
    _keep(rollouts, ws, credit, out)
    log.info(
        "demonstrations from %s: %d of %d rollouts kept (%d failed, %d below min_reward), "
        "%d transitions",
        out.source,
        out.kept,
        out.rollouts,
        out.failed,
        out.rejected,
        len(out.transitions),
    )
    return out


def _student_hashes(tokenizer: Any) -> set[str]:
    tool = {"type": "function", "function": {"name": "f", "parameters": {}}}
    hashes = set()
    for tools in (None, [tool]):
        try:
            hashes.add(_chat.template_hash(tokenizer.get_chat_template(None, tools)))
        except Exception:  # a template without a tools variant
            continue
    return hashes


def _from_store(
    ws: WarmStartConfig,
    spec: TeacherStoreConfig,
    tasks: list[Task],
    credit: CreditConfig,
    tokenizer: Any,
) -> Demonstrations:
    """Expert iteration: succeeded training rollouts of the warm start's tasks from a store,
    whose calls the student's own template rendered."""
    allowed = {t.id for t in tasks}
    hashes = _student_hashes(tokenizer)
    out = Demonstrations([], f"store:{spec.store}")
    source = open_store(spec.store)
    try:
        found = source.query(status=RolloutStatus.SUCCEEDED, limit=spec.limit)
        chosen = []
        for r in found:
            if r.task.id not in allowed or r.task.split != "train":
                continue  # val/test rollouts, or tasks outside the warm start
            full = source.get(r.id)
            if any(c.template_hash not in hashes for c in full.calls if c.status == "ok"):
                log.warning("rollout %s: rendered by another chat template; skipped", r.id)
                out.rejected += 1
                continue
            chosen.append(full)
    finally:
        source.close()
    _keep(chosen, ws, credit, out)
    log.info(
        "own successes from %s: %d rollouts kept, %d transitions",
        spec.store,
        out.kept,
        len(out.transitions),
    )
    return out
