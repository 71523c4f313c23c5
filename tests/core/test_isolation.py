"""Process isolation (issue 15 item 6): agents run in reused worker processes; a worker
that dies (``os._exit``, segfault, SIGKILL as the OOM killer sends it) fails only its
rollout, a rollout that keeps killing workers is failed as poison (across runners), a
hung agent is bounded by the default timeout and its process killed, and nothing leaks.
"""

from __future__ import annotations

import multiprocessing
import os
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from gateway_util import serve

from boltrl import Runner, Task
from boltrl.records import AttemptOutcome, Resources, RolloutStatus
from boltrl.store import MemoryStore
from boltrl.testing import ScriptedBackend

pytestmark = pytest.mark.timeout(120)

AGENT = textwrap.dedent(
    """
    import ctypes, os, signal, time

    import httpx

    import boltrl

    WARM = {"rollouts": 0}  # survives between rollouts of one worker process

    def agent(task, llm):
        WARM["rollouts"] += 1
        boltrl.emit_reward(float(os.getpid()), "pid")
        kind = task.get("kind", "ok")
        if kind == "once":  # dies on its first attempt only
            kind = "exit" if not os.path.exists(task["marker"]) else "ok"
            open(task["marker"], "a").close()
        if kind == "exit":
            os._exit(7)
        if kind == "segv":
            ctypes.string_at(0)
        if kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if kind == "bloat":
            blob = bytearray(16 * 2**30)  # far past the worker's memory cap
        if kind == "hang":
            time.sleep(3600)
        if kind == "raise":
            raise ValueError("a bug in the agent")
        if kind == "text":
            return "not a reward"
        if llm.base_url:
            r = httpx.post(llm.base_url + "/chat/completions",
                           json={"messages": [{"role": "user", "content": "hi"}]})
            r.raise_for_status()
        return float(WARM["rollouts"])
    """
)


@pytest.fixture
def spec(tmp_path: Path) -> str:
    path = tmp_path / "crashy_agent.py"
    path.write_text(AGENT)
    return f"{path}:agent"


@pytest.fixture
def store() -> Iterator[MemoryStore]:
    s = MemoryStore()
    yield s
    s.close()


def _pids(rollout: object) -> list[int]:
    return [int(e.value) for e in rollout.rewards if e.name == "pid"]  # type: ignore[attr-defined]


def test_workers_are_reused_record_through_the_runner_and_crashes_stay_in_their_rollout(
    spec: str, store: MemoryStore, tmp_path: Path
) -> None:
    with serve(ScriptedBackend(["hello"] * 8), store) as gw:
        store.publish_resources(Resources(gateway_url=gw.url, model="m"))
        kinds = ["ok", "ok", "exit", "ok", "segv", "raise", "text", "once"]
        tasks = [Task(input={"kind": k, "marker": str(tmp_path / "m")}) for k in kinds]
        ids = store.enqueue(tasks, max_attempts=3)
        runner = Runner(spec, store, isolation="process", concurrency=1, claim_wait_s=0.2)
        stats = runner.run(exit_when_idle=True)
        got = {k: store.get(i) for k, i in zip(kinds, ids, strict=True)}
    ok1, ok2 = store.get(ids[0]), store.get(ids[1])
    # One warm worker ran both: same process, its module state kept.
    assert (ok1.reward, ok2.reward) == (1.0, 2.0) and _pids(ok1) == _pids(ok2)
    assert [c.response["message"]["content"] for c in ok1.calls] == ["hello"]
    assert _pids(ok1)[0] != os.getpid()
    for kind, how in (("exit", "exit code 7"), ("segv", "killed by SIGSEGV")):
        r = got[kind]
        assert r.status is RolloutStatus.FAILED, kind
        kinds_seen = [a.error_kind for a in r.attempts]
        assert kinds_seen == ["worker_died", "poison"], (kind, kinds_seen)
        assert r.error is not None and r.error.startswith("poison: ") and how in r.error
        assert len(set(_pids(r))) == 2  # each attempt in a fresh worker
    # The rollout after a crash runs in a new worker, and succeeds.
    after = store.get(ids[3])
    assert after.status is RolloutStatus.SUCCEEDED and _pids(after) != _pids(ok1)
    assert got["raise"].attempts[-1].error_kind == "exception"
    assert "ValueError: a bug in the agent" in (got["raise"].error or "")
    assert got["text"].attempts[-1].error_kind == "bad_return"
    assert "agent returned str" in (got["text"].error or "")
    once = got["once"]
    assert once.status is RolloutStatus.SUCCEEDED
    assert [a.error_kind for a in once.attempts] == ["worker_died", None]
    # Attempts: 4 succeeded; 2 + 2 crashed, 1 raised, 1 bad return, 1 crashed then retried.
    assert (stats.claimed, stats.succeeded, stats.failed) == (11, 4, 7)
    time.sleep(0.2)
    ours = ("boltrl-runner", "boltrl-agent", "boltrl-worker-pipe")
    leaked = [t.name for t in threading.enumerate() if t.name.startswith(ours)]
    assert leaked == [] and not multiprocessing.active_children()


def test_a_poison_rollout_is_not_retried_onto_every_runner(spec: str, store: MemoryStore) -> None:
    [rid] = store.enqueue([Task(input={"kind": "kill"})], max_attempts=5)
    for _ in range(2):  # two runners, one after the other, as two machines would
        Runner(spec, store, isolation="process", claim_wait_s=0.1).run(
            max_rollouts=1, exit_when_idle=True
        )
    r = store.get(rid)
    assert r.status is RolloutStatus.FAILED and len(r.attempts) == 2
    assert [a.error_kind for a in r.attempts] == ["worker_died", "poison"]
    assert r.error is not None and "killed by SIGKILL" in r.error and "not retried" in r.error


def test_a_hung_agent_is_bounded_by_the_default_timeout_and_its_process_killed(
    spec: str, store: MemoryStore
) -> None:
    ids = store.enqueue([Task(input={"kind": "hang"}), Task(input={})], max_attempts=1)
    runner = Runner(spec, store, isolation="process", default_timeout_s=1.0, claim_wait_s=0.1)
    runner.run(exit_when_idle=True)
    hung, ok = store.get(ids[0]), store.get(ids[1])
    assert hung.attempts[0].outcome is AttemptOutcome.TIMEOUT
    assert "timeout_s=1.0" in (hung.error or "")
    [pid] = _pids(hung)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # killed, not left running
    assert ok.status is RolloutStatus.SUCCEEDED and _pids(ok) != [pid]


def test_a_memory_blow_up_under_a_cap_fails_its_rollout_and_spares_the_worker(
    spec: str, store: MemoryStore
) -> None:
    ids = store.enqueue([Task(input={"kind": "bloat"}), Task(input={})], max_attempts=1)
    Runner(spec, store, isolation="process", worker_memory_mb=2048, claim_wait_s=0.1).run(
        exit_when_idle=True
    )
    bloat, ok = store.get(ids[0]), store.get(ids[1])
    assert bloat.attempts[0].error_kind == "exception" and "MemoryError" in (bloat.error or "")
    assert ok.status is RolloutStatus.SUCCEEDED and _pids(ok) == _pids(bloat)


def test_a_thread_runner_applies_the_default_timeout_too(store: MemoryStore) -> None:
    [rid] = store.enqueue([Task(input={})], max_attempts=1)
    Runner(lambda t, llm: time.sleep(1.5), store, default_timeout_s=0.3, claim_wait_s=0.1).run(
        exit_when_idle=True
    )
    assert store.get(rid).attempts[0].outcome is AttemptOutcome.TIMEOUT


def test_an_unloadable_agent_stops_the_runner_and_requeues(store: MemoryStore) -> None:
    [rid] = store.enqueue([Task(input={})])
    stats = Runner("no_such_module_h4:agent", store, isolation="process").run(exit_when_idle=True)
    r = store.get(rid)
    assert stats.claimed == 1 and r.status is RolloutStatus.REQUEUED
    assert r.attempts[0].error_kind == "agent_load"
    assert "no_such_module_h4" in (r.attempts[0].error or "")


def test_process_isolation_needs_an_importable_agent(store: MemoryStore) -> None:
    with pytest.raises(ValueError, match="module:function"):
        Runner(lambda t, llm: 1.0, store, isolation="process")
