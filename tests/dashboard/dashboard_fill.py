"""Fill a store for the dashboard tests: real multi-agent rollouts through the gateway
(``run_rollout`` with a scripted model) and synthetic tagged rollouts of two runs."""

from __future__ import annotations

import time
from typing import Any

import httpx

import boltrl
from boltrl import LLM, Task
from boltrl.records import CallAnnotation, LLMCall, RewardEvent, ToolStep
from boltrl.store.base import Store
from boltrl.testing import ScriptedBackend

XSS = '<script>window.__xss = 1</script><img src=x onerror="window.__xss = 2">'
"""A model answer that must show as text."""

SCRIPT: list[Any] = [
    "Plan: add the numbers with the calculator, then check.",
    {"tool_calls": [{"name": "calculator", "arguments": {"expr": "2+2"}}]},
    f"The answer is 4. {XSS}",
    "Verdict: correct.",
]


def _chat(http: httpx.Client, llm: LLM, messages: list[dict[str, Any]], **kw: Any) -> Any:
    resp = http.post("/chat/completions", json={"model": llm.model, "messages": messages, **kw})
    resp.raise_for_status()
    return resp.json()


def multi_agent(task: dict[str, Any], llm: LLM) -> float:
    """A plain-code multi-agent: planner → solver (with a tool) → critic."""
    headers = {"Authorization": f"Bearer {llm.api_key}"}
    with httpx.Client(base_url=llm.base_url, headers=headers, timeout=30) as http:
        q = [{"role": "user", "content": task["question"]}]
        plan = _chat(http, llm, [{"role": "system", "content": "You plan."}, *q])
        boltrl.annotate_call(
            CallAnnotation(
                call_id=plan["id"], span_id="sp-plan", parent_id="turn-planner", agent="planner"
            )
        )
        tools = [{"type": "function", "function": {"name": "calculator", "parameters": {}}}]
        msgs = [{"role": "system", "content": "You solve."}, *q]
        ask = _chat(http, llm, msgs, tools=tools)
        boltrl.annotate_call(
            CallAnnotation(
                call_id=ask["id"], span_id="sp-ask", parent_id="turn-solver", agent="solver"
            )
        )
        tc = ask["choices"][0]["message"]["tool_calls"][0]
        boltrl.record_tool_step(
            "calculator",
            {"expr": "2+2"},
            result={"value": 4},
            call_id=ask["id"],
            parent_id=ask["id"],
            tool_call_id=tc["id"],
            agent="solver",
        )
        boltrl.emit_reward(0.25, name="tool_ok", call_id=ask["id"])
        msgs += [
            ask["choices"][0]["message"],
            {"role": "tool", "tool_call_id": tc["id"], "content": "4"},
        ]
        answer = _chat(http, llm, msgs)
        boltrl.annotate_call(
            CallAnnotation(
                call_id=answer["id"], span_id="sp-answer", parent_id="turn-solver", agent="solver"
            )
        )
        critique = _chat(
            http, llm, [{"role": "user", "content": answer["choices"][0]["message"]["content"]}]
        )
        boltrl.annotate_call(
            CallAnnotation(call_id=critique["id"], parent_id="turn-critic", agent="critic")
        )
        return 1.0


def run_real(store: Store, n: int = 2) -> list[str]:
    """``n`` real multi-agent rollouts in ``store`` (which must have nothing queued)."""
    ids = []
    for i in range(n):
        task = Task(id=f"math-{i}", input={"question": f"What is 2+2? (#{i})"})
        r = boltrl.run_rollout(multi_agent, task, backend=ScriptedBackend(SCRIPT), store=store)
        assert r.status == "succeeded", r.error
        ids.append(r.id)
    return ids


def synthetic_call(rid: str, i: int, version: int) -> LLMCall:
    now = time.time()
    return LLMCall(
        id=f"chatcmpl-{rid}-{i}",
        rollout_id=rid,
        attempt=1,
        request={"messages": [{"role": "user", "content": f"step {i}"}], "model": "policy"},
        response={
            "message": {"role": "assistant", "content": f"reply {i}"},
            "finish_reason": "stop",
        },
        prompt_token_ids=[1, 2, 3, 4],
        response_token_ids=[5, 6, 7],
        response_logprobs=[-0.1, -1.5, -3.0],
        policy_version=version,
        model="policy",
        usage={"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7},
        started_at=now,
        ended_at=now + 0.01,
    )


def add_run(store: Store, run: str, steps: int, per_step: int, *, worker: str = "w-synth") -> None:
    """Synthetic rollouts tagged like the trainer's: train rollouts every step, val every
    other step; one failure (with a traceback) per train step from step 1 on."""
    for step in range(steps):
        for phase in ("train", "val"):
            if phase == "val" and step % 2:
                continue
            tasks = [
                Task(
                    id=f"{run}-{phase}-t{k % 2}",
                    input={"k": k},
                    split=phase,
                    metadata={"run": run, "step": step, "phase": phase},
                )
                for k in range(per_step)
            ]
            store.enqueue(tasks, max_attempts=1)
            for k in range(per_step):
                att = store.claim(worker)
                assert att is not None
                rid = att.rollout_id
                agent = "solver" if k % 2 else "planner"
                call = synthetic_call(rid, 0, step)
                store.record(att, [call, CallAnnotation(call_id=call.id, agent=agent)])
                if phase == "train" and step >= 1 and k == 0:
                    tb = "Traceback (most recent call last):\n  File 'agent.py', line 3\n"
                    tb += "ValueError: <b>bad</b>"
                    store.finish(att, "failed", error=tb, error_kind="exception")
                else:
                    reward = 0.1 * step + 0.05 * k + (0.2 if phase == "val" else 0.0)
                    store.record(att, [RewardEvent(value=reward, final=True)])
                    store.finish(att, "succeeded", reward=reward)


def add_tool_only(store: Store) -> str:
    """A rollout with a tool step and reward but no model call (and a running one)."""
    [rid] = store.enqueue([Task(id="tools-only", input={})])
    att = store.claim("w-tools")
    assert att is not None
    store.record(
        att, [ToolStep(name="search", arguments={"q": "x"}, result=["a"], agent="searcher")]
    )
    return rid
