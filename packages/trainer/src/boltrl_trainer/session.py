"""A rollout session: store + gateway + in-process runners around one backend.

Both ``boltrl train`` and ``boltrl eval`` run their tasks through this: tasks are
enqueued into the store, the session's runners call the user's agent with an ``LLM``
scoped to the rollout, the agent's model calls go through a real gateway on 127.0.0.1
to the backend, and the finished rollouts come back from the store.

The trainer, not the agent, decides how the policy samples: ``PhaseSampling`` wraps the
backend and forces the phase's settings (temperature, top_p, max_tokens cap) on every
call of a rollout, so an agent that hard-codes its own temperature cannot silently make
training sample from a different distribution than the one the trainer assumes, and
validation is greedy whatever the agent asks for.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from boltrl.credit import CreditConfig
from boltrl.gateway import Gateway
from boltrl.gateway.backend import Backend, Generation, GenerationRequest, stream_of
from boltrl.records import Resources, Rollout, Task
from boltrl.runner import AgentFn, Runner, freeze_long_lived
from boltrl.scoring import summarize_scores
from boltrl.store.base import Store
from boltrl_trainer.config import TrainConfig
from boltrl_trainer.failures import failure_lines, silent_line
from boltrl_trainer.reporting import LogReporter, Reporter

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Sampling:
    """Sampling settings the session forces on a phase's calls."""

    temperature: float
    top_p: float = 1.0
    max_tokens: int = 64


class PhaseSampling:
    """A Backend wrapper that applies per-rollout sampling settings (see module doc)."""

    def __init__(self, inner: Backend, default: Sampling) -> None:
        self.inner = inner
        self.default = default
        self._by_rollout: dict[str, Sampling] = {}
        self._lock = threading.Lock()
        self._in_flight = 0
        self._busy_since = 0.0
        self._busy_total = 0.0

    @property
    def busy_s(self) -> float:
        """Seconds during which at least one model call was being served: the
        generation share of a rollout phase (the backend runs one batch at a time)."""
        with self._lock:
            extra = time.perf_counter() - self._busy_since if self._in_flight else 0.0
            return self._busy_total + extra

    @property
    def model_name(self) -> str:
        return self.inner.model_name

    @property
    def policy_version(self) -> int:
        return self.inner.policy_version

    def assign(self, rollout_ids: Sequence[str], sampling: Sampling) -> None:
        with self._lock:
            for rid in rollout_ids:
                self._by_rollout[rid] = sampling

    def forget(self, rollout_ids: Sequence[str]) -> None:
        with self._lock:
            for rid in rollout_ids:
                self._by_rollout.pop(rid, None)

    def _begin(self, request: GenerationRequest) -> GenerationRequest:
        """The request with the phase's sampling forced on it; counts it in flight."""
        with self._lock:
            s = self._by_rollout.get(request.rollout_id or "", self.default)
            if self._in_flight == 0:
                self._busy_since = time.perf_counter()
            self._in_flight += 1
        cap = min(request.max_tokens or s.max_tokens, s.max_tokens)
        return request.model_copy(
            update={"temperature": s.temperature, "top_p": s.top_p, "max_tokens": cap}
        )

    def _end(self) -> None:
        with self._lock:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._busy_total += time.perf_counter() - self._busy_since

    async def generate(self, request: GenerationRequest) -> Generation:
        forced = self._begin(request)
        try:
            return await self.inner.generate(forced)
        finally:
            self._end()

    async def generate_stream(self, request: GenerationRequest) -> AsyncIterator[str | Generation]:
        """Streams when the wrapped backend does (``boltrl.gateway.backend.stream_of``)."""
        forced = self._begin(request)
        try:
            async for event in stream_of(self.inner, forced):
                yield event
        finally:
            self._end()

    async def aclose(self) -> None:
        await self.inner.aclose()


class RolloutSession:
    """Runs tasks through ``agent`` against ``backend``; start with ``with``.

    Each phase shows live progress on ``reporter`` and ends with its rollouts' mean
    score (``boltrl.scoring``, under ``credit``: the return training uses). Not
    thread-safe: one ``run`` at a time (the trainer's loop).
    """

    def __init__(
        self,
        agent: AgentFn,
        backend: Backend,
        store: Store,
        *,
        concurrency: int,
        default_sampling: Sampling,
        timeout_s: float | None = None,
        max_attempts: int = 2,
        reporter: Reporter | None = None,
        credit: CreditConfig | None = None,
    ) -> None:
        self.backend = PhaseSampling(backend, default_sampling)
        self.store = store
        self.agent = agent
        self.concurrency = concurrency
        self.timeout_s = timeout_s
        self.max_attempts = max_attempts
        self.reporter: Reporter = reporter or LogReporter()
        self.credit = credit or CreditConfig()
        self.gateway = Gateway(self.backend, store)
        self.runner = Runner(agent, store, concurrency=concurrency, claim_wait_s=1.0)

    @classmethod
    def for_config(
        cls,
        cfg: TrainConfig,
        agent: AgentFn,
        backend: Backend,
        store: Store,
        sampling: Sampling,
        *,
        reporter: Reporter | None = None,
    ) -> RolloutSession:
        """A session as ``cfg`` runs rollouts (concurrency, rollout timeout, attempts, the
        credit that scores them), sampling with ``sampling`` unless a phase says otherwise."""
        return cls(
            agent,
            backend,
            store,
            concurrency=cfg.concurrency,
            default_sampling=sampling,
            timeout_s=cfg.rollout_timeout_s,
            max_attempts=cfg.max_attempts,
            reporter=reporter,
            credit=CreditConfig.from_dict(cfg.credit),
        )

    def __enter__(self) -> RolloutSession:
        freeze_long_lived()  # the model and the agent's SDKs are loaded by now
        self.gateway.start()
        self.publish()
        self.runner.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.runner.stop(drain=False)
        self.runner.join(10.0)
        self.gateway.stop()

    def publish(self) -> None:
        """Tell runners (ours and any remote ones) where the model is and its version."""
        self.store.publish_resources(
            Resources(
                gateway_url=self.gateway.url,
                model=self.backend.model_name,
                policy_version=self.backend.policy_version,
            )
        )

    def run(
        self,
        tasks: Sequence[Task],
        sampling: Sampling,
        *,
        label: str,
        on_progress: Callable[[int], None] | None = None,
    ) -> list[Rollout]:
        """Enqueue ``tasks`` (one rollout each), wait for all, return them in order.

        Reports, under ``label``, one line per distinct error of the failed ones and a
        warning for rollouts scored 0 because the agent returned None and emitted no
        reward (``boltrl_trainer.failures``)."""
        ids = self.store.enqueue(tasks, max_attempts=self.max_attempts, timeout_s=self.timeout_s)
        self.backend.assign(ids, sampling)
        bar = self.reporter.progress(label, len(ids))
        base = self.runner.stats.succeeded + self.runner.stats.failed
        stop = threading.Event()

        def tick() -> None:  # progress from the runner's counters: no store round trips
            while not stop.wait(0.5):
                done = self.runner.stats.succeeded + self.runner.stats.failed - base
                bar.update(min(done, len(ids)))
                if on_progress is not None:
                    on_progress(done)

        ticker = threading.Thread(target=tick, name="boltrl-progress", daemon=True)
        ticker.start()
        try:
            while True:  # one blocking wait, woken by the store when all are terminal
                out = self.store.wait(ids, timeout_s=600.0)
                if all(r.status.terminal for r in out):
                    break
        finally:
            stop.set()
            ticker.join()
            self.backend.forget(ids)
        score = summarize_scores(out, self.credit)  # of the succeeded ones, as training
        shown = f"reward {score.mean:.3f}" if score.counted else "reward n/a"
        bar.update(len(ids), shown, final=True)
        for line in failure_lines(label, out):
            self.reporter.line(line)
        silent = silent_line(label, out)
        if silent is not None:
            self.reporter.line(silent)
        return out


def tag_tasks(
    tasks: Sequence[Task],
    *,
    run: str,
    step: int,
    phase: str,
    repeat: int = 1,
    extra: Mapping[str, Any] | None = None,
) -> list[Task]:
    """Copies of ``tasks`` (each ``repeat`` times: a GRPO group) tagged for the dashboard
    (``run``, ``step``, ``phase`` and the ``extra`` keys in their metadata)."""
    out = []
    for t in tasks:
        meta: dict[str, Any] = {
            **t.metadata,
            "run": run,
            "step": step,
            "phase": phase,
            **(extra or {}),
        }
        tagged = t.model_copy(update={"metadata": meta, "split": t.split or phase})
        out.extend([tagged] * repeat)
    return out
