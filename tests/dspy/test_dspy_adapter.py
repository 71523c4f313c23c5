"""The DSPy adapter with the real SDK against a real gateway on 127.0.0.1.

Each program runs through ``boltrl.run_rollout`` on a ``ScriptedBackend``; each test
compares the whole normalized rollout. The expected prompts are rendered by DSPy's own
``ChatAdapter``, independently of what the callback captured.
"""

from __future__ import annotations

import asyncio
import importlib
import warnings
from typing import Any

import dspy
import pytest
from adapter_harness import annotation, call, normalize, reply, reward, tool_step

import boltrl
import boltrl_dspy
from boltrl.context import RolloutContext
from boltrl.gateway import Gateway
from boltrl.records import LLM, Attempt, CallAnnotation, ToolStep
from boltrl.testing import ScriptedBackend
from boltrl_dspy import BoltrlCallback

JSON = dict[str, Any]
dspy_settings = importlib.import_module("dspy.dsp.utils.settings")


def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def divide(a: int, b: int) -> float:
    """Divide a by b."""
    return a / b


class Solver(dspy.Module):
    """Two roles: a ReAct agent with a tool, then a checker."""

    def __init__(self, tool: Any = add) -> None:
        super().__init__()
        self.solve = dspy.ReAct("question -> answer", tools=[tool], max_iters=3)
        self.check = dspy.Predict("question, answer -> verdict")

    def forward(self, question: str) -> dspy.Prediction:
        answer = self.solve(question=question).answer
        return self.check(question=question, answer=answer)

    async def aforward(self, question: str) -> dspy.Prediction:
        answer = (await self.solve.acall(question=question)).answer
        return await self.check.acall(question=question, answer=answer)


def fields(**values: str) -> str:
    return "".join(f"[[ ## {k} ## ]]\n{v}\n\n" for k, v in values.items()) + "[[ ## completed ## ]]"


SCRIPT = [
    fields(next_thought="I add.", next_tool_name="add", next_tool_args='{"a": 2, "b": 3}'),
    fields(next_thought="Done.", next_tool_name="finish", next_tool_args="{}"),
    fields(reasoning="Sum.", answer="5"),
    fields(verdict="correct"),
]


def lm_for(llm: LLM, **kw: Any) -> dspy.LM:
    return dspy.LM(f"openai/{llm.model}", api_base=llm.base_url, api_key=llm.api_key, **kw)


def solver_agent(task: JSON, llm: LLM) -> float:
    lm = lm_for(llm, engine=task.get("engine", "auto"))
    with dspy.context(lm=lm, callbacks=[BoltrlCallback()]):
        out = Solver()(question=task["q"])
    assert out.verdict == "correct"
    boltrl.emit_reward(0.5)
    return 1.0


async def async_solver_agent(task: JSON, llm: LLM) -> float:
    with dspy.context(lm=lm_for(llm), callbacks=[BoltrlCallback()]):
        out = await Solver().acall(question=task["q"])
    assert out.verdict == "correct"
    boltrl.emit_reward(0.5)
    return 1.0


def prompts(question: str) -> list[list[JSON]]:
    """The four prompts of ``Solver`` on the scripted replies, as DSPy formats them."""
    prog = Solver()
    adapter = dspy.ChatAdapter()
    react, extract, check = prog.solve.react, prog.solve.extract.predict, prog.check
    t1 = {"thought_0": "I add.", "tool_name_0": "add", "tool_args_0": {"a": 2, "b": 3}}
    t1["observation_0"] = 5
    t2 = {**t1, "thought_1": "Done.", "tool_name_1": "finish", "tool_args_1": {}}
    t2["observation_1"] = "Completed."

    def fmt(pred: Any, **inputs: Any) -> list[JSON]:
        return adapter.format(pred.signature, demos=[], inputs=inputs)

    traj = prog.solve._format_trajectory
    return [
        fmt(react, question=question, trajectory=traj({})),
        fmt(react, question=question, trajectory=traj(t1)),
        fmt(extract, question=question, trajectory=traj(t2)),
        fmt(check, question=question, answer="5"),
    ]


def expected_calls(question: str, parents: list[str]) -> list[JSON]:
    agents = ["solve.react", "solve.react", "solve.extract.predict", "check"]
    return [
        call(f"call-{i}", agent=agents[i], parent=parents[i], messages=m, response=reply(SCRIPT[i]))
        for i, m in enumerate(prompts(question))
    ]


def expected_tools(calls: list[str | None], parents: list[str]) -> list[JSON]:
    return [
        tool_step(
            "add",
            {"a": 2, "b": 3},
            index=1,
            result=5,
            parent=parents[0],
            call_id=calls[0],
            tool_call_id=None,
            agent="solve.react",
        ),
        tool_step(
            "finish",
            {},
            index=3,
            result="Completed.",
            parent=parents[1],
            call_id=calls[1],
            tool_call_id=None,
            agent="solve.react",
        ),
    ]


@pytest.mark.parametrize("agent", [solver_agent, async_solver_agent], ids=["sync", "async"])
def test_react_with_a_tool_and_a_second_predictor(agent: Any) -> None:
    ro = boltrl.run_rollout(agent, {"q": "2+3?"}, backend=ScriptedBackend(SCRIPT))
    assert ro.error is None
    calls = expected_calls("2+3?", ["run-0", "run-1", "run-2", "run-3"])
    assert normalize(ro) == {
        "status": "succeeded",
        "reward": 1.0,
        "unjoined_calls": 0,
        "calls": calls,
        "annotations": [
            annotation(
                c, span=f"run-{4 + i}", index=[0, 2, 4, 5][i], call_id=f"call-{i}", framework="dspy"
            )
            for i, c in enumerate(calls)
        ],
        "tool_steps": expected_tools(["call-0", "call-1"], ["call-0", "call-1"]),
        "rewards": [reward(0.5, index=6)],
    }


def streaming_agent(task: JSON, llm: LLM) -> float:
    listener = dspy.streaming.StreamListener(signature_field_name="verdict")
    with dspy.context(lm=lm_for(llm), callbacks=[BoltrlCallback()]):
        program = dspy.streamify(Solver(), stream_listeners=[listener])

        async def run() -> list[Any]:
            return [chunk async for chunk in program(question=task["q"])]

        chunks = asyncio.run(run())
    assert chunks[-1].verdict == "correct"
    assert [c.chunk for c in chunks if isinstance(c, dspy.streaming.StreamResponse)]
    return 1.0


def test_streamed_calls_are_captured_and_joined_by_content() -> None:
    ro = boltrl.run_rollout(streaming_agent, {"q": "2+3?"}, backend=ScriptedBackend(SCRIPT))
    assert ro.error is None
    calls = expected_calls("2+3?", ["run-0", "run-1", "run-2", "run-3"])
    # DSPy streams the LM call a listener watches (the checker's): no response id then
    calls[3]["request"]["stream"] = True
    call_ids = ["call-0", "call-1", "call-2", None]
    assert normalize(ro) == {
        "status": "succeeded",
        "reward": 1.0,
        "unjoined_calls": 0,
        "calls": calls,
        "annotations": [
            annotation(
                c, span=f"run-{4 + i}", index=[0, 2, 4, 5][i], call_id=call_ids[i], framework="dspy"
            )
            for i, c in enumerate(calls)
        ],
        "tool_steps": expected_tools(["call-0", "call-1"], ["call-0", "call-1"]),
        "rewards": [],
    }


def twice_agent(task: JSON, llm: LLM) -> float:
    lm = lm_for(llm, cache=task["cache"], engine=task.get("engine", "auto"))
    with dspy.context(lm=lm, callbacks=[BoltrlCallback()]):
        Solver()(question="2+3?")
        Solver()(question="2+3?")  # same prompts: from DSPy's cache unless cache=False
    return 1.0


@pytest.mark.parametrize("engine", ["auto", "litellm"])  # DSPy's native lm15 engine, LiteLLM
def test_cached_calls_are_recorded_cached_not_unjoined_not_trained(engine: str) -> None:
    task = {"cache": True, "engine": engine}
    ro = boltrl.run_rollout(twice_agent, task, backend=ScriptedBackend(SCRIPT))
    assert ro.error is None
    calls = expected_calls("2+3?", ["run-0", "run-1", "run-2", "run-3"])
    anns = [
        annotation(
            c, span=f"run-{4 + i}", index=[0, 2, 4, 5][i], call_id=f"call-{i}", framework="dspy"
        )
        for i, c in enumerate(calls)
    ] + [
        annotation(
            c,
            span=f"run-{8 + 2 * i}",
            index=[6, 8, 10, 11][i],
            call_id=None,
            framework="dspy",
            cached=True,
            parent=f"run-{9 + 2 * i}",
        )
        for i, c in enumerate(calls)
    ]
    # the second run's tools were chosen by cached calls: their parent is the call's span
    second = expected_tools([None, None], ["run-8", "run-10"])
    second = [t | {"index": t["index"] + 6} for t in second]
    got = normalize(ro)
    assert got == {
        "status": "succeeded",
        "reward": 1.0,
        "unjoined_calls": 0,
        "calls": calls,
        "annotations": anns,
        "tool_steps": expected_tools(["call-0", "call-1"], ["call-0", "call-1"]) + second,
        "rewards": [],
    }
    assert [t.call_ids for t in boltrl.transitions(ro)] == [[c.id] for c in ro.calls]

    # a later rollout answered wholly from the cache: nothing reached the gateway
    task = {"q": "2+3?", "engine": engine}
    ro = boltrl.run_rollout(solver_agent, task, backend=ScriptedBackend(SCRIPT))
    assert (ro.calls, ro.unjoined_calls, boltrl.transitions(ro)) == ([], 0, [])
    assert [a.cached for a in ro.annotations] == [True] * 4
    assert [a.agent for a in ro.annotations] == [c["agent"] for c in calls]


def test_cache_false_sends_every_call_to_the_gateway() -> None:
    ro = boltrl.run_rollout(twice_agent, {"cache": False}, backend=ScriptedBackend(SCRIPT * 2))
    assert ro.error is None
    assert (len(ro.calls), ro.unjoined_calls) == (8, 0)
    assert [a.cached for a in ro.annotations] == [False] * 8
    assert [c.agent for c in ro.calls] == [c["agent"] for c in expected_calls("2+3?", [""] * 4)] * 2
    assert len(boltrl.transitions(ro)) == 8


def crashing_agent(task: JSON, llm: LLM) -> float:
    with dspy.context(lm=lm_for(llm, num_retries=0), callbacks=[BoltrlCallback()]):
        dspy.ReAct("question -> answer", tools=[divide], max_iters=2)(question="1/0?")
        raise RuntimeError("agent gave up")


def test_an_agent_that_raises_is_failed_and_keeps_its_records() -> None:
    script: list[Any] = [
        fields(next_thought="Divide.", next_tool_name="divide", next_tool_args='{"a": 1, "b": 0}'),
        fields(next_thought="Stop.", next_tool_name="finish", next_tool_args="{}"),
        fields(reasoning="No.", answer="undefined"),
    ]
    ro = boltrl.run_rollout(crashing_agent, {}, backend=ScriptedBackend(script))
    assert ro.status == "failed"
    assert ro.error is not None and "RuntimeError: agent gave up" in ro.error
    assert (len(ro.calls), len(ro.annotations), ro.unjoined_calls) == (3, 3, 0)
    assert [c.agent for c in ro.calls] == ["react", "react", "extract.predict"]
    steps = [
        t.model_dump(include={"name", "arguments", "result", "error", "agent"})
        for t in ro.tool_steps
    ]
    assert steps == [
        {
            "name": "divide",
            "arguments": {"a": 1, "b": 0},
            "result": None,
            "error": "ZeroDivisionError: division by zero",
            "agent": "react",
        },
        {
            "name": "finish",
            "arguments": {},
            "result": "Completed.",
            "error": None,
            "agent": "react",
        },
    ]
    assert [t.parent_id for t in ro.tool_steps] == [c.id for c in ro.calls[:2]]


def failing_lm_agent(task: JSON, llm: LLM) -> float:
    with dspy.context(lm=lm_for(llm, num_retries=0), callbacks=[BoltrlCallback()]):
        dspy.Predict("question -> answer")(question="?")
    return 1.0


def test_a_failed_lm_call_is_recorded_and_joined_to_the_failed_gateway_call() -> None:
    ro = boltrl.run_rollout(
        failing_lm_agent, {}, backend=ScriptedBackend([RuntimeError("model down")])
    )
    assert ro.status == "failed"
    [c] = ro.calls
    [a] = ro.annotations
    assert (c.status, c.agent, ro.unjoined_calls) == ("failed", "Predict", 0)
    assert a.call_id is None and a.response is not None and "error" in a.response
    assert a.request_messages == c.request["messages"]


def bare_agent(task: JSON, llm: LLM) -> float:
    with dspy.context(lm=lm_for(llm)):
        Solver()(question=task["q"])
    return 1.0


def test_instrument_is_idempotent_and_uninstrument_restores_dspy() -> None:
    config = dspy_settings.main_thread_config
    before = config["callbacks"]
    owner = dspy_settings.config_owner_thread_id
    try:
        cb = boltrl_dspy.instrument()
        assert boltrl_dspy.instrument() is cb and boltrl_dspy.installed() is cb
        assert config["callbacks"] == [*before, cb]
        ro = boltrl.run_rollout(bare_agent, {"q": "2+3?"}, backend=ScriptedBackend(SCRIPT))
        assert (len(ro.calls), len(ro.annotations), len(ro.tool_steps)) == (4, 4, 2)
        assert [c.agent for c in ro.calls] == [
            "solve.react",
            "solve.react",
            "solve.extract.predict",
            "check",
        ]
        assert ro.unjoined_calls == 0
    finally:
        boltrl_dspy.uninstrument()
        boltrl_dspy.uninstrument()
    assert config["callbacks"] is before
    assert dspy_settings.config_owner_thread_id == owner  # instrument() claimed no thread
    assert boltrl_dspy.installed() is None
    ro = boltrl.run_rollout(bare_agent, {"q": "3+4?"}, backend=ScriptedBackend(SCRIPT))
    assert (len(ro.calls), ro.annotations, ro.tool_steps) == (4, [], [])


def test_outside_a_rollout_it_records_nothing_and_never_raises() -> None:
    before = boltrl_dspy.stats()
    cb = BoltrlCallback()
    gw = Gateway(ScriptedBackend(SCRIPT), None)
    gw.start()
    try:
        llm = LLM(base_url=f"{gw.url}/v1", model="scripted")
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            with dspy.context(lm=lm_for(llm, cache=False), callbacks=[cb]):
                out = Solver()(question="2+3?")
    finally:
        gw.stop()
    assert out.verdict == "correct"
    assert boltrl_dspy.stats() == before
    assert (cb._open.frames, cb._open.calls, cb._open.tools) == ({}, {}, {})


@pytest.fixture
def attempt() -> Attempt:
    return Attempt(
        rollout_id="ro-1",
        number=1,
        worker_id="w",
        started_at=1.0,
        lease_expires_at=2.0,
        last_heartbeat=1.0,
    )


def test_odd_fields_are_left_empty_and_failures_are_counted_not_raised(attempt: Attempt) -> None:
    sunk: list[Any] = []
    cb = BoltrlCallback()
    before = boltrl_dspy.stats()
    with RolloutContext(attempt, lambda a, recs: sunk.extend(recs)):
        # an LM with no history and messages that are not a list: fields fail alone
        cb.on_lm_start("lm-1", object(), {"messages": 5, "prompt": None, "kwargs": {}})
        cb.on_lm_end("lm-1", ["hi"])
        # a tool whose arguments cannot be read still records its result
        cb.on_tool_start("t-1", dspy.Tool(add), {"kwargs": 7})
        cb.on_tool_end("t-1", 3)
        # a hook that cannot record at all is counted, not raised
        cb.on_module_start([], dspy.Predict("a -> b"), {})  # type: ignore[arg-type]
    after = boltrl_dspy.stats()
    [ann] = [r for r in sunk if isinstance(r, CallAnnotation)]
    [step] = [r for r in sunk if isinstance(r, ToolStep)]
    assert (ann.request_messages, ann.response, ann.call_id, ann.cached) == (
        None,
        {"message": {"role": "assistant", "content": "hi"}, "finish_reason": None},
        None,
        False,
    )
    assert (step.name, step.arguments, step.result) == ("add", None, 3)
    assert after["calls"] - before["calls"] == 1
    assert after["field_failures"] - before["field_failures"] == 2
    assert after["failures"] - before["failures"] == 1
