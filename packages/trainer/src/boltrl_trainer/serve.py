"""``boltrl serve CONFIG``: serve a deployed agent's model and learn from its users.

What runs, in one process:

- the **store** (``store``, default ``sqlite:///{out_dir}/store.db``: sessions and their
  feedback survive a restart);
- the **gateway** in session mode on ``serve.host:serve.port`` (127.0.0.1 unless told):
  an agent points its OpenAI client at ``{url}/sessions/{SESSION_ID}/v1`` (or sends
  ``X-Boltrl-Session: SESSION_ID`` to ``{url}/v1``); each conversation is a session,
  recorded as a rollout with exact token ids, logprobs and the policy version that
  answered; ``POST {url}/sessions/{SESSION_ID}/feedback {"reward": r}`` (or
  ``boltrl.feedback.send_feedback``) rates it, any time before
  ``serve.feedback_timeout_s`` after its last call;
- the **served policy** (torch, in-process) behind the gateway, with ``temperature`` /
  ``top_p`` / ``max_tokens`` forced on every call (the update assumes the distribution
  the recorded logprobs came from; an agent's own temperature is overridden);
- the **learner** thread (``boltrl_trainer.learner``): every ``learn.every_sessions``
  rewarded sessions or ``learn.every_minutes``, it trains a candidate copy, scores it on
  the gate and promotes or discards it (``{out_dir}/promotions.jsonl``; the dashboard's
  Promotions page: ``boltrl dashboard --store sqlite:///{out_dir}/store.db
  --promotions {out_dir}/promotions.jsonl``).
"""

from __future__ import annotations

import logging
from typing import Any

from boltrl.gateway import Gateway
from boltrl.gateway.sessions import SessionConfig
from boltrl.store import open_store
from boltrl_trainer.gate import Gate
from boltrl_trainer.learner import Learner
from boltrl_trainer.metrics import MetricsWriter
from boltrl_trainer.reporting import Reporter
from boltrl_trainer.serve_candidate import CandidatePolicy
from boltrl_trainer.serve_config import ServeConfig
from boltrl_trainer.session import PhaseSampling, Sampling

log = logging.getLogger(__name__)

__all__ = ["OnlineServer"]


class OnlineServer:
    """Everything ``boltrl serve`` runs (module docstring). ``start()`` returns once the
    gateway accepts calls (the learner scores the served version in the background);
    ``stop()`` ends the learner's round in progress, then the rest. Use with ``with``."""

    def __init__(self, cfg: ServeConfig, *, reporter: Reporter | None = None) -> None:
        self.cfg = cfg
        self.reporter = reporter
        self.store: Any = None
        self.policy: CandidatePolicy | None = None
        self.gateway: Gateway | None = None
        self.gate: Gate | None = None
        self.learner: Learner | None = None
        self.metrics: MetricsWriter | None = None

    @property
    def url(self) -> str:
        """``http://HOST:PORT`` of the gateway."""
        assert self.gateway is not None, "start() first"
        return self.gateway.url

    def session_url(self, session_id: str) -> str:
        """The OpenAI ``base_url`` of one session."""
        assert self.gateway is not None, "start() first"
        return self.gateway.session_url(session_id)

    def start(self, *, learn: bool = True) -> OnlineServer:
        """Start serving; with ``learn`` False the learner is built but not started
        (call ``learner.round()`` yourself: tests and benchmarks). Idempotent."""
        if self.gateway is not None:
            return self
        cfg, train = self.cfg, self.cfg.train
        cfg.out_dir.mkdir(parents=True, exist_ok=True)
        try:
            self.store = open_store(train.store_url)
            self.policy = CandidatePolicy(cfg)
            live = PhaseSampling(
                self.policy.server, Sampling(train.temperature, train.top_p, train.max_tokens)
            )
            s = cfg.serve
            self.gateway = Gateway(
                live,
                self.store,
                host=s.host,
                port=s.port,
                token=s.token,
                sessions=SessionConfig(
                    feedback_timeout_s=s.feedback_timeout_s,
                    sweep_interval_s=min(30.0, s.feedback_timeout_s / 4),
                ),
            )
            self.gate = Gate(cfg, reporter=self.reporter)
            self.metrics = MetricsWriter(
                cfg.out_dir,
                report_to=train.report_to,
                run_name="serve",
                config={"train": train.model_dump(mode="json"), "serve": s.model_dump()},
            )
            self.learner = Learner(
                cfg,
                self.store,
                self.policy,
                self.gate,
                metrics=self.metrics,
                reporter=self.reporter,
            )
            self.gateway.start()
            if learn:
                self.learner.start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop everything started; idempotent."""
        if self.learner is not None:
            self.learner.stop()
        if self.gateway is not None:
            self.gateway.stop()
        for part in (self.gate, self.policy, self.metrics, self.store):
            if part is not None:
                try:
                    part.close()
                except Exception as e:  # close the rest regardless
                    log.warning("closing %s failed: %s", type(part).__name__, e)
        self.learner = self.gateway = self.gate = self.policy = self.metrics = None
        self.store = None

    def __enter__(self) -> OnlineServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
