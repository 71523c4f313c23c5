"""The background learner of ``boltrl serve``: rewarded live sessions → a gated new policy.

A round, read top to bottom (``Learner.round``):

1. take every session whose feedback arrived since the cursor (``SessionStore.
   rewarded_sessions``; expired and unrated sessions are never listed, so never trained
   on): a backlog is drained and counted, never left to grow staler;
2. transitions by credit assignment; keep those at most ``learn.max_staleness``
   promotions behind the served version (``offpolicy.select_fresh``: older ones are
   dropped and counted; the update corrects the kept stale ones by importance weights),
   of at most ``learn.max_sessions`` sessions, the last rewarded (the rest are counted
   ``over_budget``);
3. REINFORCE advantages against a running baseline (``serve_config`` says why);
4. update the candidate copy (``CandidatePolicy.train``: users keep being served);
5. score it on the gate; promote it (``candidate >= served - tolerance``) or reset it;
   log the decision (``gate.DecisionLog``) and the round's metrics (``metrics.jsonl``).

A round starts when ``learn.every_sessions`` sessions are waiting, or after
``learn.every_minutes`` with at least ``learn.min_sessions`` waiting. The learner looks
every ``learn.poll_s`` (a cheap store read; it also sweeps expired sessions), because
the store has no wait for feedback: feedback arrives through the gateway's thread, and a
second of latency on a minutes-long cycle costs nothing.

The cursor, the running baseline and the counters are saved after every round to
``{out_dir}/learner.json`` (after the weights): a restart neither trains on a session
twice nor forgets what it decided.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from boltrl.credit import CreditConfig, MissingTokenIds, transitions
from boltrl.records import Rollout, RolloutStatus, Transition
from boltrl.scoring import summarize_scores
from boltrl.store.base import SessionStore, Store
from boltrl_trainer.algorithms import RunningBaseline, compute_advantages
from boltrl_trainer.gate import Decision, DecisionLog, Gate, GateScore
from boltrl_trainer.metrics import MetricsWriter
from boltrl_trainer.offpolicy import select_fresh
from boltrl_trainer.reporting import LogReporter, Reporter
from boltrl_trainer.seams import TrainBatch
from boltrl_trainer.serve_candidate import CandidatePolicy
from boltrl_trainer.serve_config import ServeConfig

log = logging.getLogger(__name__)

__all__ = ["Learner", "LearnerState"]

_PAGE = 500


@dataclass
class LearnerState:
    """What survives a restart (``learner.json``)."""

    cursor: int = 0
    """``rewarded_sessions`` cursor: sessions up to it were read."""
    round: int = 0
    baseline: float | None = None
    counters: dict[str, int] = field(
        default_factory=lambda: {
            "sessions": 0,
            "trained_sessions": 0,
            "transitions": 0,
            "dropped_stale": 0,
            "refused": 0,
            "over_budget": 0,
            "promotions": 0,
            "rollbacks": 0,
        }
    )

    @classmethod
    def load(cls, path: Path) -> LearnerState:
        if not path.is_file():
            return cls()
        data = json.loads(path.read_text())
        state = cls(int(data["cursor"]), int(data["round"]), data.get("baseline"))
        state.counters.update({k: int(v) for k, v in data.get("counters", {}).items()})
        return state

    def save(self, path: Path) -> None:
        tmp = path.with_name(path.name + ".tmp")
        body = {
            "cursor": self.cursor,
            "round": self.round,
            "baseline": self.baseline,
            "counters": self.counters,
        }
        tmp.write_text(json.dumps(body, indent=2))
        tmp.replace(path)


class Learner:
    """Trains, gates and promotes in a background thread (``start`` / ``stop``), or one
    ``round`` at a time from the caller's thread (tests, benchmarks). Rounds never run
    concurrently."""

    def __init__(
        self,
        cfg: ServeConfig,
        store: Store,
        policy: CandidatePolicy,
        gate: Gate,
        *,
        metrics: MetricsWriter | None = None,
        reporter: Reporter | None = None,
    ) -> None:
        if not isinstance(store, SessionStore):
            raise TypeError(f"boltrl serve needs a store with sessions, not {type(store)}")
        self.cfg = cfg
        self.learn = cfg.serve.learn
        self.store: Any = store
        self.policy = policy
        self.gate = gate
        self.credit = CreditConfig.from_dict(cfg.train.credit)
        self.state_path = cfg.out_dir / "learner.json"
        self.state = LearnerState.load(self.state_path)
        self.baseline = RunningBaseline(self.state.baseline)
        self.log = DecisionLog(cfg.out_dir / "promotions.jsonl")
        self.metrics = metrics
        self.reporter: Reporter = reporter or LogReporter()
        self.served_score: GateScore | None = None
        self._expired_seen = self._expired_total()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None
        """What ended the background thread, if anything did."""

    # -- the served version's score -------------------------------------------------------

    def score_served(self) -> GateScore:
        """Score the served version on the gate (cached until the next promotion) and log
        it as the ``initial`` decision. The candidate equals the served weights here."""
        with self._lock:
            v = self.policy.served_version
            score = self.gate.score(self.policy.gate_server, version=v)
            self.served_score = score
            self.log.append(
                Decision(
                    round=self.state.round,
                    time=time.time(),
                    decision="initial",
                    served_version=v,
                    candidate_version=v,
                    version_after=v,
                    served_score=score.mean,
                    candidate_score=score.mean,
                    tolerance=self.gate.tolerance,
                    gate_tasks=score.tasks,
                    candidate_failed=score.failed,
                    gate_s=score.seconds,
                    sessions=0,
                    trained_sessions=0,
                    transitions=0,
                    dropped_stale=0,
                    over_budget=0,
                    expired=0,
                    session_reward_mean=0.0,
                    update_s=0.0,
                    reason="served at start",
                )
            )
            self.reporter.line(
                f"serving v{v}: gate score {score.mean:.3f} over {score.tasks} tasks"
            )
            return score

    # -- the background thread ------------------------------------------------------------

    def start(self) -> Learner:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="boltrl-learner", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout_s: float = 600.0) -> None:
        """Stop after the round in progress (if any); waits for it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def _run(self) -> None:
        last = time.monotonic()
        try:
            if self.served_score is None:
                self.score_served()
            while not self._stop.wait(self.learn.poll_s):
                self.store.expire_sessions()
                waiting = len(
                    self.store.rewarded_sessions(
                        after=self.state.cursor, limit=self.learn.every_sessions
                    ).rollouts
                )
                timed = time.monotonic() - last >= self.learn.every_minutes * 60
                if waiting >= self.learn.every_sessions or (
                    timed and waiting >= self.learn.min_sessions
                ):
                    self.round()
                    last = time.monotonic()
        except BaseException as e:  # reported by serve's status and the log, not lost
            log.exception("learner stopped")
            self.error = e

    # -- one round ------------------------------------------------------------------------

    def round(self) -> Decision | None:
        """Train on the waiting sessions, gate and promote or reset; None when no
        session was waiting."""
        with self._lock:
            if self.served_score is None:
                raise RuntimeError("score_served() first: the gate needs the served score")
            sessions: list[Rollout] = []
            cursor = self.state.cursor
            while True:  # drain: a backlog is read (and counted) now, not left to go stale
                page = self.store.rewarded_sessions(after=cursor, limit=_PAGE)
                sessions.extend(page.rollouts)
                cursor = page.cursor
                if len(page.rollouts) < _PAGE:
                    break
            if not sessions:
                return None
            return self._round(sessions, cursor)

    def _round(self, sessions: list[Rollout], cursor: int) -> Decision:
        st = self.state
        st.round += 1
        served = self.policy.served_version
        trans, refused = self._transitions(sessions)
        kept, stale = select_fresh(trans, served, self.learn.max_staleness)
        kept, over = _newest(kept, self.learn.max_sessions)
        trained_ids = {t.rollout_id for t in kept}
        trained = [r for r in sessions if r.id in trained_ids]
        reward = summarize_scores(trained, self.credit).mean if trained else 0.0
        expired_total = self._expired_total()
        expired = expired_total - self._expired_seen
        self._expired_seen = expired_total
        upd: dict[str, float] = {}
        if kept:
            adv = compute_advantages(kept, None, self.cfg.algo, running=self.baseline)
            keep = adv.keep.tolist()
            batch_t = [t for t, k in zip(kept, keep, strict=True) if k]
            values = [a for a, k in zip(adv.advantages.tolist(), keep, strict=True) if k]
            batch = TrainBatch(
                batch_t, values, served, self.cfg.train.temperature, [t.group for t in batch_t]
            )
            upd = self.policy.train(batch)
        decision = self._decide(st.round, served, bool(kept), upd)
        decision = _with(
            decision,
            sessions=len(sessions),
            trained_sessions=len(trained),
            transitions=len(kept),
            dropped_stale=stale.dropped,
            over_budget=over,
            expired=expired,
            session_reward_mean=reward,
        )
        st.cursor = cursor
        st.baseline = self.baseline.value
        c = st.counters
        c["sessions"] += len(sessions)
        c["trained_sessions"] += len(trained)
        c["transitions"] += len(kept)
        c["dropped_stale"] += stale.dropped
        c["refused"] += refused
        c["over_budget"] += over
        if decision.decision == "promote":
            c["promotions"] += 1
        elif decision.decision == "rollback":
            c["rollbacks"] += 1
        self.log.append(decision)
        st.save(self.state_path)
        if self.metrics is not None:
            self.metrics.write(st.round, self._row(decision, upd, stale.metrics(), refused))
        self.reporter.line(
            f"round {st.round}: {decision.decision} -> serving v{decision.version_after} | "
            f"{len(sessions)} sessions ({len(trained)} trained, reward "
            f"{reward:.3f}), {stale.dropped} stale transitions dropped, {expired} expired | "
            f"{decision.reason}"
        )
        return decision

    def _decide(self, round_no: int, served: int, trained: bool, upd: dict[str, float]) -> Decision:
        assert self.served_score is not None
        before = self.served_score
        base = Decision(
            round=round_no,
            time=time.time(),
            decision="skip",
            served_version=served,
            candidate_version=served,
            version_after=served,
            served_score=before.mean,
            candidate_score=before.mean,
            tolerance=self.gate.tolerance,
            gate_tasks=0,
            candidate_failed=0,
            gate_s=0.0,
            sessions=0,
            trained_sessions=0,
            transitions=0,
            dropped_stale=0,
            over_budget=0,
            expired=0,
            session_reward_mean=0.0,
            update_s=upd.get("time/update_s", 0.0),
            reason="no fresh transitions: nothing trained",
        )
        if not trained or upd.get("update/skipped"):
            return base
        cand_version = self.policy.candidate_version
        cand = self.gate.score(self.policy.gate_server, version=cand_version)
        figures = {
            "candidate_version": cand_version,
            "candidate_score": cand.mean,
            "gate_tasks": cand.tasks,
            "candidate_failed": cand.failed,
            "gate_s": cand.seconds,
        }
        bar = before.mean - self.gate.tolerance
        if self.gate.admits(cand, before):
            self.policy.promote()
            self.served_score = cand  # the promoted weights' score: the new cached one
            return _with(
                base,
                **figures,
                decision="promote",
                version_after=cand_version,
                reason=f"candidate {cand.mean:.3f} >= served {before.mean:.3f} - "
                f"tolerance {self.gate.tolerance:g} = {bar:.3f}",
            )
        self.policy.reset()
        return _with(
            base,
            **figures,
            decision="rollback",
            reason=f"candidate {cand.mean:.3f} < served {before.mean:.3f} - tolerance "
            f"{self.gate.tolerance:g} = {bar:.3f}: discarded, v{served} stays",
        )

    def _transitions(self, sessions: list[Rollout]) -> tuple[list[Transition], int]:
        out: list[Transition] = []
        refused = 0
        for r in sessions:
            if r.status != RolloutStatus.SUCCEEDED:  # the store lists rewarded ones only
                continue
            try:
                out.extend(transitions(r, self.credit))
            except MissingTokenIds as e:
                refused += 1
                log.error("refusing session %s for training: %s", r.id, e)
        return out, refused

    def _expired_total(self) -> int:
        return int(self.store.count(status=RolloutStatus.CANCELLED))

    def _row(
        self, d: Decision, upd: dict[str, float], stale: dict[str, float], refused: int
    ) -> dict[str, Any]:
        return {
            **upd,
            **stale,
            "serve/served_version": d.version_after,
            "serve/served_score": self.served_score.mean if self.served_score else 0.0,
            "serve/candidate_score": d.candidate_score,
            "serve/promoted": 1.0 if d.decision == "promote" else 0.0,
            "serve/sessions": d.sessions,
            "serve/trained_sessions": d.trained_sessions,
            "serve/expired": d.expired,
            "serve/over_budget": d.over_budget,
            "serve/refused": refused,
            "serve/session_reward_mean": d.session_reward_mean,
            "serve/baseline": self.baseline.value or 0.0,
        }


def _newest(kept: list[Transition], limit: int) -> tuple[list[Transition], int]:
    """The transitions of the ``limit`` sessions rewarded last (feedback order), and how
    many sessions were left out: the freshest feedback is worth the most."""
    order = list(dict.fromkeys(t.rollout_id for t in kept))
    if len(order) <= limit:
        return kept, 0
    chosen = set(order[-limit:])
    return [t for t in kept if t.rollout_id in chosen], len(order) - limit


def _with(d: Decision, **changes: Any) -> Decision:
    return replace(d, **changes)
