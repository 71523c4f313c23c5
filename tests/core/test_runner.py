"""Runner: agents sync and async, rewards and tool steps via the rollout context,
failures, retries, timeouts, concurrency, and the ``boltrl runner`` CLI."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import boltrl
from boltrl import LLM, RolloutStatus, Runner, Task, open_store
from boltrl.runner import Retryable


@pytest.fixture
def store():
    st = open_store("memory://")
    yield st
    st.close()


def _run_all(agent: Any, store: Any, n: int, *, concurrency: int = 1, **enqueue: Any) -> list[Any]:
    ids = store.enqueue([Task(id=f"t{i}", input={"i": i}) for i in range(n)], **enqueue)
    Runner(agent, store, concurrency=concurrency, claim_wait_s=0.05, lease_s=5.0).run(
        exit_when_idle=True
    )
    return store.wait(ids, timeout_s=10)


def test_sync_agent_reward_rewards_and_tool_steps(store: Any) -> None:
    def agent(task: dict[str, Any], llm: LLM) -> float:
        assert isinstance(llm, LLM)
        boltrl.emit_reward(0.25, name="progress")
        boltrl.record_tool_step("calc", {"x": task["i"]}, result=task["i"] * 2)
        return 1.0

    [r] = _run_all(agent, store, 1)
    assert r.status == RolloutStatus.SUCCEEDED
    assert r.reward == 1.0
    assert [(e.name, e.value, e.attempt) for e in r.rewards] == [("progress", 0.25, 1)]
    assert [(t.name, t.arguments, t.result) for t in r.tool_steps] == [("calc", {"x": 0}, 0)]
    assert len(r.attempts) == 1 and r.attempts[0].outcome == "succeeded"


def test_async_agent_and_spawned_tasks_and_threads_reach_the_rollout(store: Any) -> None:
    async def agent(task: dict[str, Any], llm: LLM) -> float:
        async def child() -> None:
            boltrl.emit_reward(0.1, name="child-task")

        await asyncio.gather(child(), asyncio.to_thread(boltrl.emit_reward, 0.2, "to-thread"))
        t = threading.Thread(target=boltrl.emit_reward, args=(0.3, "plain-thread"))
        t.start()
        t.join()
        return 0.5

    [r] = _run_all(agent, store, 1)
    assert r.status == RolloutStatus.SUCCEEDED, r.error
    assert sorted(e.name for e in r.rewards) == ["child-task", "plain-thread", "to-thread"]
    assert r.reward == 0.5


def test_concurrent_rollouts_keep_their_records_apart(store: Any) -> None:
    def agent(task: dict[str, Any], llm: LLM) -> float:
        for k in range(3):
            boltrl.emit_reward(float(task["i"]), name=f"r{k}")
            time.sleep(0.002)
        return float(task["i"])

    out = _run_all(agent, store, 24, concurrency=6)
    for r in out:
        assert r.status == RolloutStatus.SUCCEEDED
        assert [e.value for e in r.rewards] == [r.reward] * 3
        assert llm_rollout_matches(r)


def llm_rollout_matches(r: Any) -> bool:
    return all(e.rollout_id == r.id for e in r.rewards)


def test_agent_exception_is_a_failed_attempt_with_traceback(store: Any) -> None:
    def agent(task: dict[str, Any], llm: LLM) -> float:
        boltrl.emit_reward(0.5)
        raise RuntimeError("the agent broke")

    [r] = _run_all(agent, store, 1, max_attempts=3)
    assert r.status == RolloutStatus.FAILED
    assert len(r.attempts) == 1  # a bug in the agent is not retried
    assert "RuntimeError: the agent broke" in (r.attempts[0].error or "")
    assert "Traceback" in (r.attempts[0].error or "")
    assert r.attempts[0].error_kind == "exception"
    assert [e.value for e in r.rewards] == [0.5]  # what it recorded before failing is kept


def test_retryable_failures_retry_until_max_attempts(store: Any) -> None:
    calls: list[int] = []

    def agent(task: dict[str, Any], llm: LLM) -> float:
        calls.append(1)
        if len(calls) < 2:
            raise Retryable("flaky")
        return 1.0

    [r] = _run_all(agent, store, 1, max_attempts=3)
    assert r.status == RolloutStatus.SUCCEEDED
    assert [a.outcome for a in r.attempts] == ["failed", "succeeded"]

    def always(task: dict[str, Any], llm: LLM) -> float:
        raise ConnectionError("gateway down")

    [r2] = _run_all(always, store, 1, max_attempts=2)
    assert r2.status == RolloutStatus.FAILED
    assert len(r2.attempts) == 2


def test_hung_agent_is_abandoned_on_timeout(store: Any) -> None:
    release = threading.Event()

    # The agents hang for 60 s and the runs must end long before: the bound is loose
    # because a niced suite beside a training run gets ~10% of a core (1 s took 7.8 s).
    def agent(task: dict[str, Any], llm: LLM) -> float:
        release.wait(60)
        boltrl.emit_reward(9.0, name="late")  # after the timeout: dropped
        return 1.0

    async def async_agent(task: dict[str, Any], llm: LLM) -> float:
        await asyncio.sleep(60)
        return 1.0

    t0 = time.monotonic()
    [r] = _run_all(agent, store, 1, max_attempts=1, timeout_s=0.3)
    [r2] = _run_all(async_agent, store, 1, max_attempts=2, timeout_s=0.2)
    assert time.monotonic() - t0 < 30.0
    release.set()
    assert r.status == RolloutStatus.FAILED
    assert r.attempts[0].error_kind == "timeout"
    assert r2.status == RolloutStatus.FAILED and len(r2.attempts) == 2
    time.sleep(0.1)
    assert store.get(r.id).rewards == []


def test_bad_return_value_fails_clearly(store: Any) -> None:
    def agent(task: dict[str, Any], llm: LLM) -> Any:
        return "yes"

    [r] = _run_all(agent, store, 1)
    assert r.status == RolloutStatus.FAILED
    assert "expected a float reward or None" in (r.attempts[0].error or "")


def test_emit_reward_outside_rollout_warns_once() -> None:
    import boltrl.context as c

    c._warned.discard("emit_reward")
    with pytest.warns(RuntimeWarning, match="outside a rollout"):
        assert boltrl.emit_reward(1.0) is None
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert boltrl.emit_reward(1.0) is None  # second time: silent


def test_llm_is_attempt_scoped_and_its_token_is_not_stored(store: Any) -> None:
    store.publish_resources(boltrl.Resources(gateway_url="http://127.0.0.1:9", model="m"))
    seen: list[LLM] = []

    def agent(task: dict[str, Any], llm: LLM) -> None:
        seen.append(llm)

    [r] = _run_all(agent, store, 1)
    assert r.status == RolloutStatus.SUCCEEDED and r.reward is None
    m = re.fullmatch(
        rf"http://127\.0\.0\.1:9/rollouts/{r.id}/attempts/1/([A-Za-z0-9_-]{{32}})/v1",
        seen[0].base_url,
    )
    assert m is not None, seen[0].base_url
    assert seen[0].model == "m" and seen[0].rollout_id == r.id
    assert m.group(1) not in store.get(r.id).model_dump_json()


AGENT_FILE = textwrap.dedent(
    """
    import time
    import boltrl

    def agent(task, llm):
        boltrl.emit_reward(0.5)
        time.sleep(task.get("sleep", 0))
        return float(task["i"])
    """
)


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "boltrl.cli", *args]


def test_runner_cli_runs_sqlite_store(tmp_path: Path) -> None:
    (tmp_path / "my_agent.py").write_text(AGENT_FILE)
    db = f"sqlite:///{tmp_path / 'x.db'}"
    st = open_store(db)
    ids = st.enqueue([Task(input={"i": i}) for i in range(5)])
    st.close()
    proc = subprocess.run(
        _cli(
            "runner",
            "--store",
            db,
            "--agent",
            f"{tmp_path / 'my_agent.py'}:agent",
            "--concurrency",
            "2",
            "--exit-when-idle",
        ),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "succeeded 5" in proc.stdout
    st = open_store(db)
    try:
        out = st.wait(ids, timeout_s=1)
        assert [r.reward for r in out] == [0.0, 1.0, 2.0, 3.0, 4.0]
        assert all(r.status == RolloutStatus.SUCCEEDED for r in out)
    finally:
        st.close()


def test_runner_cli_bad_agent_spec_is_a_clear_error(tmp_path: Path) -> None:
    proc = subprocess.run(
        _cli("runner", "--store", "memory://", "--agent", "no_such_module_xyz:agent"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "cannot import 'no_such_module_xyz'" in proc.stdout


def test_ctrl_c_drains_running_rollouts(tmp_path: Path) -> None:
    from boltrl.store.server import serve_in_thread

    (tmp_path / "my_agent.py").write_text(AGENT_FILE)
    st = open_store("memory://")
    server = serve_in_thread(st)
    [rid] = st.enqueue([Task(input={"i": 7, "sleep": 1.5})])
    proc = subprocess.Popen(
        _cli("runner", "--store", server.url, "--agent", f"{tmp_path / 'my_agent.py'}:agent"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while st.get(rid).status != RolloutStatus.RUNNING and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        r = st.get(rid)
        assert r.status == RolloutStatus.SUCCEEDED and r.reward == 7.0
        assert "succeeded 1" in out
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        server.stop()
        st.close()


def test_eight_runner_slots_over_500_rollouts_with_injected_failures() -> None:
    """Every rollout ends succeeded or failed with exactly the attempts its injected
    failures call for; none lost, none run twice at once."""
    st = open_store("memory://")

    def plan(i: int, attempt: int) -> str:
        # deterministic per (task, attempt): ok, retryable failure or hard failure
        h = (i * 7919 + attempt * 104729) % 10
        return "retry" if h < 3 else "fail" if h == 3 else "ok"

    def agent(task: dict[str, Any], llm: LLM) -> float:
        ctx = boltrl.current_rollout()
        assert ctx is not None
        what = plan(task["i"], ctx.attempt.number)
        if what == "retry":
            raise Retryable("injected")
        if what == "fail":
            raise ValueError("injected")
        return 1.0

    try:
        ids = st.enqueue([Task(id=f"t{i}", input={"i": i}) for i in range(500)], max_attempts=3)
        Runner(agent, st, concurrency=8, claim_wait_s=0.05).run(exit_when_idle=True)
        out = st.wait(ids, timeout_s=30)
        for r in out:
            i = int(r.task.id[1:])
            expected: list[str] = []
            for n in (1, 2, 3):
                expected.append(plan(i, n))
                if expected[-1] != "retry":
                    break
            outcomes = [a.outcome.value for a in r.attempts]
            assert len(outcomes) == len(expected), (r.id, outcomes, expected)
            want = RolloutStatus.SUCCEEDED if expected[-1] == "ok" else RolloutStatus.FAILED
            assert r.status == want
        assert st.count() == 500
    finally:
        st.close()
