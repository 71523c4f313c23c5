"""``run_rollout``: run one task through an agent in-process, end to end.

The "what did boltrl capture from my agent?" command: it serves the backend through a
real gateway on 127.0.0.1, runs the agent exactly as a runner would (rollout context,
heartbeats, timeout), and returns the finished ``Rollout`` with every call, tool step
and reward recorded.
"""

from __future__ import annotations

from typing import Any

from boltrl.errors import InvalidInput
from boltrl.gateway.backend import Backend
from boltrl.records import Resources, Rollout, Task
from boltrl.runner import AgentFn, Runner
from boltrl.store.base import Store


def _as_task(task: Task | dict[str, Any]) -> Task:
    if isinstance(task, Task):
        return task
    if isinstance(task, dict):
        return Task(input=task)
    raise InvalidInput(f"task must be a boltrl.Task or a dict (got {type(task).__name__})")


def run_rollout(
    agent: AgentFn,
    task: Task | dict[str, Any],
    *,
    backend: Backend | None = None,
    store: Store | None = None,
    timeout_s: float | None = None,
    model: str | None = None,
    sampling: dict[str, Any] | None = None,
) -> Rollout:
    """Run ``agent`` on one task and return the finished rollout.

    ``backend`` (e.g. ``boltrl.testing.ScriptedBackend([...])`` or a trainer's
    ``TransformersBackend``) is served through a gateway started for the call and stopped
    after it; without one the agent gets an ``LLM`` with no endpoint. ``store`` defaults
    to a fresh in-memory store; pass your own (e.g. SQLite) to keep the rollout — it must
    have no other queued rollouts, since the runner claims the oldest one. Runs one
    attempt (no retries). The agent's exceptions are captured in the rollout (status
    ``failed`` with the traceback), never raised.
    """
    from boltrl.store import open_store

    own_store = store is None
    st: Store = open_store("memory://") if store is None else store
    gateway = None
    try:
        if backend is not None:
            from boltrl.gateway import Gateway

            gateway = Gateway(backend, st)
            gateway.start()
            st.publish_resources(
                Resources(
                    gateway_url=gateway.url,
                    model=model or backend.model_name,
                    policy_version=backend.policy_version,
                    sampling=sampling or {},
                )
            )
        [rollout_id] = st.enqueue([_as_task(task)], max_attempts=1, timeout_s=timeout_s)
        runner = Runner(agent, st, concurrency=1, claim_wait_s=0.0)
        runner.run(max_rollouts=1, exit_when_idle=True)
        out = st.wait([rollout_id], timeout_s=5.0)[0]
        if not out.status.terminal:  # someone else's rollout was claimed instead
            raise InvalidInput(
                f"rollout {rollout_id} was not run: the store had other queued rollouts"
            )
        return out
    finally:
        if gateway is not None:
            gateway.stop()
        if own_store:
            st.close()
