"""The gate of ``boltrl serve``: a candidate policy is served only if it holds up on
held-out tasks.

``Gate.score(backend)`` runs the held-out tasks (``serve.gate.tasks``, the first
``limit``) through the real agent against ``backend``, greedily, exactly as ``boltrl
eval`` does (``RolloutSession``: store, gateway, runners), and scores them as training
scores rollouts (``boltrl.scoring``; a failed task counts 0, so a candidate that breaks
the agent loses). ``admits(candidate, served)`` is the rule: promote when
``candidate >= served - tolerance``.

The gate's rollouts go to their own store (``{out_dir}/gate.db``), never the serving
store: the learner reads that one, and gate tasks are not live traffic. Open it with
``boltrl dashboard --store sqlite:///{out_dir}/gate.db`` (run ``gate``, step = the
candidate's version).

``DecisionLog`` appends each promotion and rollback with the figures that decided it
to ``{out_dir}/promotions.jsonl`` (the dashboard's Promotions page reads it).
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from boltrl.credit import CreditConfig
from boltrl.gateway.backend import Backend
from boltrl.loading import load_object
from boltrl.scoring import summarize_scores
from boltrl.store import open_store
from boltrl.store.base import Store
from boltrl_trainer.reporting import Reporter
from boltrl_trainer.serve_config import ServeConfig
from boltrl_trainer.session import RolloutSession, Sampling, tag_tasks
from boltrl_trainer.tasks import load_tasks

__all__ = ["Decision", "DecisionLog", "Gate", "GateScore", "read_decisions"]


@dataclass(frozen=True)
class GateScore:
    """One policy version's score on the gate's tasks."""

    version: int
    mean: float
    """Mean reward over every task (a failed rollout scores 0)."""
    std: float
    tasks: int
    failed: int
    seconds: float


class Gate:
    """Scores policies on the held-out tasks; not thread-safe (the learner's thread)."""

    def __init__(
        self, cfg: ServeConfig, *, store: Store | None = None, reporter: Reporter | None = None
    ) -> None:
        gate = cfg.serve.gate
        self.cfg = cfg
        self.tolerance = gate.tolerance
        self.agent = load_object(gate.agent or cfg.train.agent, what="serve.gate.agent")
        self.tasks = load_tasks(gate.tasks, split="gate")[: gate.limit]
        self.credit = CreditConfig.from_dict(cfg.train.credit)
        self.reporter = reporter
        if store is None:
            cfg.out_dir.mkdir(parents=True, exist_ok=True)
            store = open_store(f"sqlite:///{cfg.out_dir / 'gate.db'}")
        self.store = store

    def score(self, backend: Backend, *, version: int) -> GateScore:
        """``backend``'s greedy score on the gate tasks, recorded as run ``gate``, step
        ``version``. Blocks until every task finished."""
        t0 = time.perf_counter()
        greedy = Sampling(0.0, 1.0, self.cfg.train.max_tokens)
        session = RolloutSession.for_config(
            self.cfg.train, self.agent, backend, self.store, greedy, reporter=self.reporter
        )
        tasks = tag_tasks(self.tasks, run="gate", step=version, phase="gate")
        with session:
            out = session.run(tasks, greedy, label=f"gate v{version}")
        s = summarize_scores(out, self.credit, failed_as=0.0)
        return GateScore(version, s.mean, s.std, len(out), s.failed, time.perf_counter() - t0)

    def admits(self, candidate: GateScore, served: GateScore) -> bool:
        """The rule: the candidate may be served when it is at most ``tolerance`` worse."""
        return candidate.mean >= served.mean - self.tolerance

    def close(self) -> None:
        self.store.close()


@dataclass(frozen=True)
class Decision:
    """One gate decision, as logged (one JSON object per line of promotions.jsonl)."""

    round: int
    """The learner's round (1, 2, ...)."""
    time: float
    """Unix time of the decision."""
    decision: Literal["promote", "rollback", "skip", "initial"]
    """``promote``: the candidate is served from now on; ``rollback``: it was discarded
    and the served version stays; ``skip``: nothing fresh to train on (no candidate);
    ``initial``: the version served at start, scored."""
    served_version: int
    """The version served before the decision."""
    candidate_version: int
    """The version the candidate was (would have been) served as."""
    version_after: int
    """The version served after the decision."""
    served_score: float
    candidate_score: float
    tolerance: float
    gate_tasks: int
    candidate_failed: int
    gate_s: float
    """Seconds the candidate's gate run took."""
    sessions: int
    """Rewarded sessions this round read."""
    trained_sessions: int
    """... of which had calls fresh enough to train on."""
    transitions: int
    """Transitions trained on."""
    dropped_stale: int
    """Transitions dropped as older than ``max_staleness``."""
    over_budget: int
    """Fresh sessions left out: more than ``max_sessions`` were waiting."""
    expired: int
    """Sessions expired (no feedback by the deadline) since the previous round."""
    session_reward_mean: float
    """Mean feedback of the sessions trained on."""
    update_s: float
    reason: str


class DecisionLog:
    """Append-only JSONL of ``Decision``s; each line is flushed and fsynced. Thread-safe."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def append(self, decision: Decision) -> None:
        line = json.dumps(asdict(decision), allow_nan=False)
        with self._lock, self.path.open("a") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())


def read_decisions(path: Path) -> list[dict[str, Any]]:
    """The decisions logged so far (a missing file: none); a torn last line is skipped."""
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out
