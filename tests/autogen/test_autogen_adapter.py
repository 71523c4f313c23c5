"""The AutoGen adapter with the real AgentChat against a real gateway on 127.0.0.1.

Each agent runs through ``boltrl.run_rollout`` on a ``ScriptedBackend``; each test
compares the whole normalized rollout (every call with its token ids, every annotation,
tool step and reward).
"""

from __future__ import annotations

import asyncio
import logging
import warnings
from collections.abc import Iterator
from functools import partial
from typing import Any

import adapter_harness
import pytest
from adapter_harness import called_tool, reply, reward, tool_call, tool_step
from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.conditions import MaxMessageTermination
from autogen_agentchat.teams import RoundRobinGroupChat
from autogen_core.logging import LLMCallEvent, LLMStreamEndEvent, LLMStreamStartEvent, ToolCallEvent
from autogen_core.models import ModelInfo
from autogen_ext.models.openai import OpenAIChatCompletionClient

import boltrl
import boltrl_autogen
from boltrl.context import RolloutContext
from boltrl.credit import transitions
from boltrl.errors import BackendError
from boltrl.gateway import Gateway
from boltrl.records import LLM, Attempt, Resources, RolloutStatus, Task
from boltrl.store import open_store
from boltrl.testing import ScriptedBackend
from boltrl_autogen import AGENTCHAT_LOGGER, CORE_LOGGER, BoltrlEventHandler

# AutoGen sends tool_choice with its tools, and its events carry the response message only
call = partial(adapter_harness.call, tool_choice="auto")
annotation = partial(adapter_harness.annotation, message_only=True)
normalize = partial(adapter_harness.normalize, refs="span")

JSON = dict[str, Any]
FW = "autogen"
recorded = partial(adapter_harness.recorded, framework=FW, message_only=True)
INFO = ModelInfo(
    vision=False,
    function_calling=True,
    json_output=False,
    family="unknown",
    structured_output=False,
)


def logger_state() -> list[tuple[int, bool, list[logging.Handler]]]:
    return [
        (lg.level, lg.propagate, list(lg.handlers))
        for lg in map(logging.getLogger, (CORE_LOGGER, AGENTCHAT_LOGGER))
    ]


@pytest.fixture
def instrumented() -> Iterator[BoltrlEventHandler]:
    handler = boltrl_autogen.instrument()
    try:
        yield handler
    finally:
        boltrl_autogen.uninstrument()


async def add(a: int, b: int) -> int:
    """Add two numbers."""
    boltrl.emit_reward(0.5)
    return a + b


async def divide(a: int, b: int) -> float:
    """Divide a by b."""
    return a / b


def client(llm: LLM) -> OpenAIChatCompletionClient:
    return OpenAIChatCompletionClient(
        model=llm.model, base_url=llm.base_url, api_key=llm.api_key, model_info=INFO, max_retries=0
    )


def team(llm: LLM, *, stream: bool, tool: Any = add) -> RoundRobinGroupChat:
    """planner ⇄ solver (with a tool, reflecting on its result): two agents and a tool."""
    c = client(llm)
    planner = AssistantAgent(
        "planner", model_client=c, system_message="You plan.", model_client_stream=stream
    )
    solver = AssistantAgent(
        "solver",
        model_client=c,
        tools=[tool],
        system_message="You solve.",
        model_client_stream=stream,
        reflect_on_tool_use=True,
    )
    return RoundRobinGroupChat([planner, solver], termination_condition=MaxMessageTermination(4))


def make_agent(*, stream: bool) -> Any:
    async def agent(task: JSON, llm: LLM) -> float:
        await team(llm, stream=stream).run(task=task["q"])
        return 1.0

    return agent


SCRIPT: list[Any] = [
    "Let the solver add 2 and 3.",
    {"tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}}]},
    "It is 5.",
    "Done: 5",
]
PLAN = {"role": "system", "content": "You plan."}
SOLVE = {"role": "system", "content": "You solve."}
USER = {"role": "user", "content": "what is 2+3?", "name": "user"}
ASKED = {"role": "user", "content": "Let the solver add 2 and 3.", "name": "planner"}


def fn_tool(name: str, description: str) -> JSON:
    ints = {
        "a": {"description": "a", "title": "A", "type": "integer"},
        "b": {"description": "b", "title": "B", "type": "integer"},
    }
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": ints,
                "required": ["a", "b"],
                "additionalProperties": False,
            },
            "strict": False,
        },
    }


ADD_TOOL = fn_tool("add", "Add two numbers.")
ADD = tool_call("call_1_0", "add", '{"a": 2, "b": 3}')


@pytest.mark.parametrize("stream", [False, True], ids=["create", "model_client_stream"])
def test_round_robin_team_with_a_tool_is_recorded_whole(
    instrumented: BoltrlEventHandler, stream: bool
) -> None:
    ro = boltrl.run_rollout(
        make_agent(stream=stream), {"q": USER["content"]}, backend=ScriptedBackend(SCRIPT)
    )
    used = [
        {"role": "assistant", "content": None, "tool_calls": [ADD]},
        {"role": "tool", "content": "5", "tool_call_id": "call_1_0"},
    ]
    kw: Any = {"stream": stream}
    calls = [
        call(
            "call-0",
            agent="planner",
            parent="span-0",
            messages=[PLAN, USER],
            response=reply("Let the solver add 2 and 3."),
            **kw,
        ),
        call(
            "call-1",
            agent="solver",
            parent="span-1",
            messages=[SOLVE, USER, ASKED],
            tools=[ADD_TOOL],
            response=reply(None, [ADD]),
            **kw,
        ),
        call(
            "call-2",
            agent="solver",
            parent="span-1",
            messages=[SOLVE, USER, ASKED, *used],
            response=reply("It is 5."),
            **kw,
        ),
        call(
            "call-3",
            agent="planner",
            parent="span-0",
            messages=[
                PLAN,
                USER,
                {"role": "assistant", "content": "Let the solver add 2 and 3."},
                {"role": "user", "content": "It is 5.", "name": "solver"},
            ],
            response=reply("Done: 5"),
            **kw,
        ),
    ]
    # a streamed call's id never reaches AutoGen's events: joined by order and content
    cid = [None if stream else f"call-{i}" for i in range(4)]
    added = called_tool("add", {"a": 2, "b": 3}, call=1, index=3, result="5", agent="solver")
    assert normalize(ro) == recorded(
        calls,
        spans=["span-2", "span-3", "span-4", "span-5"],
        indexes=[0, 1, 4, 5],
        tool_steps=[added],
        rewards=[reward(0.5, index=2)],
        call_ids=cid,
    )


def test_agent_that_raises_is_failed_with_everything_kept(
    instrumented: BoltrlEventHandler,
) -> None:
    """The solver's tool fails (recorded as an error, the team goes on); then the model
    call after it fails, AgentChat raises out of ``run``: the rollout is failed and keeps
    every call, annotation and tool step made before."""

    async def agent(task: JSON, llm: LLM) -> float:
        await team(llm, stream=False, tool=divide).run(task=task["q"])
        return 1.0

    script = [
        "Let the solver divide 1 by 0.",
        {"tool_calls": [{"name": "divide", "arguments": {"a": 1, "b": 0}}]},
        BackendError("the model is gone"),
    ]
    ro = boltrl.run_rollout(agent, {"q": USER["content"]}, backend=ScriptedBackend(script))
    assert ro.error is not None and "the model is gone" in ro.error
    asked = {"role": "user", "content": "Let the solver divide 1 by 0.", "name": "planner"}
    div = tool_call("call_1_0", "divide", '{"a": 1, "b": 0}')
    div_tool = fn_tool("divide", "Divide a by b.")
    calls = [
        call(
            "call-0",
            agent="planner",
            parent="span-0",
            messages=[PLAN, USER],
            response=reply("Let the solver divide 1 by 0."),
        ),
        call(
            "call-1",
            agent="solver",
            parent="span-1",
            messages=[SOLVE, USER, asked],
            tools=[div_tool],
            response=reply(None, [div]),
        ),
        # AutoGen logs no event for a call that failed: the gateway's record stays bare
        call(
            "call-2",
            agent=None,
            parent=None,
            messages=[
                SOLVE,
                USER,
                asked,
                {"role": "assistant", "content": None, "tool_calls": [div]},
                {"role": "tool", "content": "division by zero", "tool_call_id": "call_1_0"},
            ],
            response=reply("unused"),
        )
        | {
            "response": {},
            "prompt_token_ids": None,
            "response_token_ids": None,
            "response_logprobs": None,
            "policy_version": None,
            "template_hash": None,
            "usage": {},
            "status": "failed",
            "error": "BackendError: the model is gone",
        },
    ]
    divided = called_tool(
        "divide", {"a": 1, "b": 0}, call=1, index=2, error="division by zero", agent="solver"
    )
    assert normalize(ro) == recorded(
        calls,
        spans=["span-2", "span-3"],
        indexes=[0, 1],
        tool_steps=[divided],
        failed=True,
    )


def test_instrument_twice_then_uninstrument_restores_the_loggers() -> None:
    core, chat = logging.getLogger(CORE_LOGGER), logging.getLogger(AGENTCHAT_LOGGER)
    before = logger_state()
    first = boltrl_autogen.instrument()
    assert boltrl_autogen.instrument() is first
    assert boltrl_autogen.installed() is first
    assert core.handlers.count(first) == chat.handlers.count(first) == 1
    # enabled for boltrl only: AutoGen's event stream does not reach the root handlers
    assert (core.level, core.propagate, chat.level, chat.propagate) == (20, False, 10, False)
    boltrl_autogen.uninstrument()
    boltrl_autogen.uninstrument()
    assert logger_state() == before
    assert boltrl_autogen.installed() is None


def test_instrument_leaves_loggers_the_user_enabled_alone() -> None:
    core = logging.getLogger(CORE_LOGGER)
    mine = logging.NullHandler()
    core.setLevel(logging.DEBUG)
    core.addHandler(mine)
    try:
        before = logger_state()
        handler = boltrl_autogen.instrument()
        assert (core.level, core.propagate, core.handlers[-2:]) == (10, True, [mine, handler])
        boltrl_autogen.uninstrument()
        assert logger_state() == before
    finally:
        core.removeHandler(mine)
        core.setLevel(logging.NOTSET)


def test_outside_a_rollout_nothing_is_recorded_and_nothing_raised(
    instrumented: BoltrlEventHandler,
) -> None:
    before = boltrl_autogen.stats()
    with Gateway(ScriptedBackend(SCRIPT)) as gw, warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        llm = LLM(base_url=f"{gw.url}/v1", model="scripted")
        result = asyncio.run(team(llm, stream=False).run(task=USER["content"]))
    assert result.messages[-1].to_text() == "Done: 5"
    assert boltrl_autogen.stats() == before
    assert len(instrumented._states) == 0


def test_a_lone_agent_with_the_handler_on_the_core_logger_only() -> None:
    """The manual route: the handler on autogen-core's logger alone, an agent run outside
    any team (no runtime, so no agent id on the events: a model call's agent comes from
    the agent's frame on the stack). Tool runs come from ``ToolCallEvent`` alone: no
    agent, no tool-call id, no errors."""
    core = logging.getLogger(CORE_LOGGER)
    handler = BoltrlEventHandler()
    core.addHandler(handler)
    core.setLevel(logging.INFO)

    async def agent(task: JSON, llm: LLM) -> float:
        solver = AssistantAgent(
            "solver", model_client=client(llm), tools=[add], system_message="You solve."
        )
        await solver.run(task=task["q"])
        return 1.0

    try:
        ro = boltrl.run_rollout(agent, {"q": USER["content"]}, backend=ScriptedBackend(SCRIPT[1:]))
    finally:
        core.removeHandler(handler)
        core.setLevel(logging.NOTSET)
    [c] = [
        call(
            "call-0",
            agent="solver",
            parent=None,
            messages=[SOLVE, USER],
            tools=[ADD_TOOL],
            response=reply(None, [tool_call("call_0_0", "add", '{"a": 2, "b": 3}')]),
        )
    ]
    assert normalize(ro) == {
        "status": "succeeded",
        "reward": 1.0,
        "unjoined_calls": 0,
        "calls": [c],
        "annotations": [annotation(c, span="span-0", index=0, call_id="call-0", framework=FW)],
        "tool_steps": [
            tool_step(
                "add",
                {"a": 2, "b": 3},
                index=2,
                result="5",
                parent=None,
                call_id=None,
                tool_call_id=None,
                agent=None,
            )
        ],
        "rewards": [reward(0.5, index=1)],
    }


def test_concurrent_rollouts_keep_their_own_records(instrumented: BoltrlEventHandler) -> None:
    """One handler serves every agent of the process: events of rollouts running side
    by side go each to their own rollout."""
    store = open_store("memory://")
    with Gateway(ScriptedBackend(SCRIPT, delay_s=0.02), store) as gw:
        store.publish_resources(Resources(gateway_url=gw.url, model="scripted"))
        ids = store.enqueue([Task(input={"q": f"what is {i}+3?"}) for i in range(4)])
        boltrl.Runner(make_agent(stream=True), store, concurrency=4).run(
            max_rollouts=4, exit_when_idle=True
        )
        done = store.wait(ids, timeout_s=30)
    store.close()
    for i, ro in enumerate(done):
        assert ro.status == RolloutStatus.SUCCEEDED
        assert ro.unjoined_calls == 0
        assert [c.agent for c in ro.calls] == ["planner", "solver", "solver", "planner"]
        [step] = ro.tool_steps
        assert (step.name, step.parent_id, step.agent) == ("add", ro.calls[1].id, "solver")
        for a in ro.annotations:
            assert a.request_messages is not None
            assert a.request_messages[1]["content"] == f"what is {i}+3?"


def attempt() -> Attempt:
    return Attempt(
        rollout_id="ro-1",
        number=1,
        worker_id="w",
        started_at=1.0,
        lease_expires_at=2.0,
        last_heartbeat=1.0,
    )


def test_a_stream_that_never_ended_is_annotated_when_the_next_one_starts(
    instrumented: BoltrlEventHandler,
) -> None:
    """Events logged the way AutoGen's model clients log them (the documented API)."""
    events = logging.getLogger(CORE_LOGGER)
    first = [{"role": "user", "content": "one"}]
    second = [{"role": "user", "content": "two"}]
    sunk: list[Any] = []
    with RolloutContext(attempt(), lambda a, recs: sunk.extend(recs)):
        events.info(LLMStreamStartEvent(messages=first))
        events.info(LLMStreamStartEvent(messages=second))
        done = {"content": "ok", "finish_reason": "stop", "thought": None}
        events.info(LLMStreamEndEvent(response=done, prompt_tokens=1, completion_tokens=1))
    assert [(a.request_messages, a.response, a.index) for a in sunk] == [
        (first, None, 0),
        (second, {"message": {"role": "assistant", "content": "ok"}}, 1),
    ]


def test_odd_fields_are_left_empty_and_failures_are_counted_not_raised(
    instrumented: BoltrlEventHandler,
) -> None:
    events = logging.getLogger(CORE_LOGGER)
    sunk: list[Any] = []
    before = boltrl_autogen.stats()
    with RolloutContext(attempt(), lambda a, recs: sunk.extend(recs)):
        # messages that are not messages; a response that is no ChatCompletion
        events.info(
            LLMCallEvent(messages=5, response={"id": 7}, prompt_tokens=0, completion_tokens=0)
        )  # type: ignore[arg-type]
        # a tool event with no AgentChat request to pair with: recorded on its own
        events.info(ToolCallEvent(tool_name="t", arguments={"x": 1}, result="r"))
    after = boltrl_autogen.stats()
    ann, step = sunk
    assert (ann.call_id, ann.request_messages, ann.response, ann.agent) == (None, None, None, None)
    assert (step.name, step.arguments, step.result, step.tool_call_id) == ("t", {"x": 1}, "r", None)
    assert after["field_failures"] == before["field_failures"] + 1
    assert after["failures"] == before["failures"]


def test_a_lone_agent_reflecting_on_its_tool_names_both_calls(
    instrumented: BoltrlEventHandler,
) -> None:
    """A lone AssistantAgent with ``reflect_on_tool_use=True`` makes its final-answer call
    from the reflection flow, not ``_call_llm``: that call too is the agent's, so
    ``credit.agents: [calc]`` trains on it."""

    async def agent(task: JSON, llm: LLM) -> float:
        calc = AssistantAgent(
            "calc",
            model_client=client(llm),
            tools=[add],
            system_message="You solve.",
            reflect_on_tool_use=True,
        )
        await calc.run(task=task["q"])
        return 1.0

    ro = boltrl.run_rollout(agent, {"q": USER["content"]}, backend=ScriptedBackend(SCRIPT[1:3]))
    add_call = tool_call("call_0_0", "add", '{"a": 2, "b": 3}')
    used = [
        {"role": "assistant", "content": None, "tool_calls": [add_call]},
        {"role": "tool", "content": "5", "tool_call_id": "call_0_0"},
    ]
    calls = [
        call(
            "call-0",
            agent="calc",
            parent=None,
            messages=[SOLVE, USER],
            tools=[ADD_TOOL],
            response=reply(None, [add_call]),
        ),
        call(
            "call-1",
            agent="calc",
            parent=None,
            messages=[SOLVE, USER, *used],
            response=reply("It is 5."),
        ),
    ]
    added = called_tool("add", {"a": 2, "b": 3}, call=0, index=2, result="5", agent="calc")
    assert normalize(ro) == recorded(
        calls,
        spans=["span-0", "span-1"],
        indexes=[0, 3],
        tool_steps=[added],
        rewards=[reward(0.5, index=1)],
    )
    trained = transitions(ro, "final", agents=["calc"])
    assert [t.call_ids for t in trained] == [[ro.calls[0].id], [ro.calls[1].id]]
