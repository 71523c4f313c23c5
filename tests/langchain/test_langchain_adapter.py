"""The LangChain/LangGraph adapter with the real SDKs against a real gateway on 127.0.0.1.

Each agent runs through ``boltrl.run_rollout`` on a ``ScriptedBackend``; each test
compares the whole normalized rollout (every call with its token ids, every annotation,
tool step and reward).
"""

from __future__ import annotations

import asyncio
import warnings
from functools import partial
from typing import Any

import adapter_harness
import pytest
from adapter_harness import annotation, call, called_tool, normalize, reply, reward, tool_call
from langchain_core.caches import InMemoryCache
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, LLMResult
from langchain_core.tools import tool
from langchain_core.tracers import context as lc_context
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from pydantic import BaseModel

import boltrl
import boltrl_langchain
from boltrl.context import RolloutContext
from boltrl.gateway import Gateway
from boltrl.records import LLM, Attempt, CallAnnotation
from boltrl.testing import ScriptedBackend
from boltrl_langchain import BoltrlCallbackHandler

JSON = dict[str, Any]
recorded = partial(adapter_harness.recorded, framework="langchain")


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@tool
def divide(a: int, b: int) -> float:
    """Divide a by b."""
    return a / b


def schema(name: str, description: str) -> JSON:
    ints = {"a": {"type": "integer"}, "b": {"type": "integer"}}
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": ints, "required": ["a", "b"]},
        },
    }


ADD = schema("add", "Add two numbers.")
DIVIDE = schema("divide", "Divide a by b.")
PLAN = {"role": "system", "content": "You plan."}
WRITE = {"role": "system", "content": "You write."}
USER = {"role": "user", "content": "2+3?"}


def model(llm: LLM, **kw: Any) -> ChatOpenAI:
    return ChatOpenAI(base_url=llm.base_url, api_key=llm.api_key, model=llm.model, **kw)  # type: ignore[arg-type]


def graph(llm: LLM, tools: list[Any], *, crash_writer: bool = False) -> CompiledStateGraph:  # type: ignore[type-arg]
    """planner (with tools) ⇄ tools, then writer: two roles and a tool."""
    m = model(llm)
    planner = m.bind_tools(tools)

    def plan(state: MessagesState) -> JSON:
        return {"messages": [planner.invoke([PLAN, *state["messages"]])]}

    async def aplan(state: MessagesState) -> JSON:
        return {"messages": [await planner.ainvoke([PLAN, *state["messages"]])]}

    def write(state: MessagesState) -> JSON:
        if crash_writer:
            raise RuntimeError("writer crashed")
        return {"messages": [m.invoke([WRITE, *state["messages"]])]}

    async def awrite(state: MessagesState) -> JSON:
        return {"messages": [await m.ainvoke([WRITE, *state["messages"]])]}

    g = StateGraph(MessagesState)
    g.add_node("planner", plan, afunc=aplan)  # type: ignore[call-overload]
    g.add_node("tools", ToolNode(tools, handle_tool_errors=True))
    g.add_node("writer", write, afunc=awrite)  # type: ignore[call-overload]
    g.add_edge(START, "planner")
    g.add_conditional_edges("planner", tools_condition, {"tools": "tools", END: "writer"})
    g.add_edge("tools", "planner")
    g.add_edge("writer", END)
    return g.compile()


SCRIPT = [
    {"tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}}]},
    "It is 5.",
    "Answer: 5",
]
INPUT = {"messages": [("user", "2+3?")]}


def invoke_agent(task: JSON, llm: LLM) -> float:
    graph(llm, [add]).invoke(INPUT, config={"callbacks": [BoltrlCallbackHandler()]})
    boltrl.emit_reward(0.5)
    return 1.0


def stream_agent(task: JSON, llm: LLM) -> float:
    # stream_mode="messages" makes every chat model in the graph stream its tokens
    cfg: Any = {"callbacks": [BoltrlCallbackHandler()]}
    for _ in graph(llm, [add]).stream(INPUT, config=cfg, stream_mode="messages"):
        pass
    boltrl.emit_reward(0.5)
    return 1.0


async def astream_agent(task: JSON, llm: LLM) -> float:
    cfg: Any = {"callbacks": [BoltrlCallbackHandler()]}
    async for _ in graph(llm, [add]).astream(INPUT, config=cfg, stream_mode="messages"):
        pass
    boltrl.emit_reward(0.5)
    return 1.0


def expected_graph_rollout(*, streamed: bool) -> JSON:
    tc = tool_call("call_0_0", "add", '{"a": 2, "b": 3}')
    asked = {"role": "assistant", "content": None, "tool_calls": [tc]}
    answered = {"role": "tool", "content": "5", "tool_call_id": "call_0_0"}
    calls = [
        call(
            "call-0",
            agent="planner",
            parent="run-0",
            messages=[PLAN, USER],
            tools=[ADD],
            response=reply(None, [tc]),
            stream=streamed,
        ),
        call(
            "call-1",
            agent="planner",
            parent="run-1",
            messages=[PLAN, USER, asked, answered],
            tools=[ADD],
            response=reply("It is 5."),
            stream=streamed,
        ),
        call(
            "call-2",
            agent="writer",
            parent="run-2",
            messages=[WRITE, USER, asked, answered, {"role": "assistant", "content": "It is 5."}],
            response=reply("Answer: 5"),
            stream=streamed,
        ),
    ]
    # a streamed ChatOpenAI call carries no response id: joined by order and content
    cid = [None if streamed else f"call-{i}" for i in range(3)]
    return recorded(
        calls,
        spans=["run-3", "run-4", "run-5"],
        indexes=[0, 2, 3],
        tool_steps=[
            called_tool("add", {"a": 2, "b": 3}, call=0, index=1, result="5", agent="planner")
        ],
        rewards=[reward(0.5, index=4)],
        call_ids=cid,
    )


@pytest.mark.parametrize(
    ("agent", "streamed"),
    [(invoke_agent, False), (stream_agent, True), (astream_agent, True)],
    ids=["invoke", "stream", "astream"],
)
def test_langgraph_two_roles_and_a_tool(agent: Any, streamed: bool) -> None:
    ro = boltrl.run_rollout(agent, {"q": "2+3"}, backend=ScriptedBackend(SCRIPT))
    assert ro.error is None
    assert normalize(ro) == expected_graph_rollout(streamed=streamed)


class Answer(BaseModel):
    value: int


def structured_agent(task: JSON, llm: LLM) -> float:
    cfg: Any = {"callbacks": [BoltrlCallbackHandler()], "run_name": "extractor"}
    m = model(llm)
    assert m.with_structured_output(Answer).invoke("2+3?", config=cfg) == Answer(value=5)
    fc = m.with_structured_output(Answer, method="function_calling")
    assert fc.invoke("2+3?", config=cfg) == Answer(value=6)
    streamed = list(m.with_structured_output(Answer).stream("2+3?", config=cfg))
    assert streamed[-1] == Answer(value=7)
    return 1.0


def test_with_structured_output_calls_are_captured() -> None:
    script = [
        '{"value": 5}',
        {"tool_calls": [{"name": "Answer", "arguments": {"value": 6}}]},
        '{"value": 7}',
    ]
    with warnings.catch_warnings():  # langchain-openai's own pydantic warning on `parsed`
        warnings.simplefilter("ignore", UserWarning)
        ro = boltrl.run_rollout(structured_agent, {}, backend=ScriptedBackend(script))
    assert ro.error is None
    answer_tool = {
        "type": "function",
        "function": {
            "name": "Answer",
            "description": "",
            "parameters": {
                "type": "object",
                "properties": {"value": {"type": "integer"}},
                "required": ["value"],
            },
        },
    }
    tc = tool_call("call_1_0", "Answer", '{"value": 6}')
    q = [USER]
    calls = [
        call(
            "call-0", agent="ChatOpenAI", parent="run-0", messages=q, response=reply('{"value": 5}')
        ),
        call(
            "call-1",
            agent="ChatOpenAI",
            parent="run-1",
            messages=q,
            response=reply(None, [tc]),
            tools=[answer_tool],
        ),
        call(
            "call-2",
            agent="ChatOpenAI",
            parent="run-2",
            messages=q,
            response=reply('{"value": 7}'),
            stream=True,
        ),
    ]
    calls[1]["request"]["tool_choice"] = {"type": "function", "function": {"name": "Answer"}}
    got = normalize(ro)
    assert got == {
        "status": "succeeded",
        "reward": 1.0,
        "unjoined_calls": 0,
        "calls": calls,
        "annotations": [
            annotation(
                calls[i], span=f"run-{i + 3}", index=i, call_id=f"call-{i}", framework="langchain"
            )
            for i in range(3)
        ],
        "tool_steps": [],
        "rewards": [],
    }


def crashing_agent(task: JSON, llm: LLM) -> float:
    g = graph(llm, [divide], crash_writer=True)
    g.invoke({"messages": [("user", "1/0?")]}, config={"callbacks": [BoltrlCallbackHandler()]})
    return 1.0


def test_an_agent_that_raises_is_failed_and_keeps_its_records() -> None:
    script = [{"tool_calls": [{"name": "divide", "arguments": {"a": 1, "b": 0}}]}, "Cannot."]
    ro = boltrl.run_rollout(crashing_agent, {}, backend=ScriptedBackend(script))
    assert ro.status == "failed"
    assert ro.error is not None and "RuntimeError: writer crashed" in ro.error
    tc = tool_call("call_0_0", "divide", '{"a": 1, "b": 0}')
    q = {"role": "user", "content": "1/0?"}
    err = "Error: ZeroDivisionError('division by zero')\n Please fix your mistakes."
    answered = {"role": "tool", "content": err, "tool_call_id": "call_0_0"}
    asked = {"role": "assistant", "content": None, "tool_calls": [tc]}
    calls = [
        call(
            "call-0",
            agent="planner",
            parent="run-0",
            messages=[PLAN, q],
            tools=[DIVIDE],
            response=reply(None, [tc]),
        ),
        call(
            "call-1",
            agent="planner",
            parent="run-1",
            messages=[PLAN, q, asked, answered],
            tools=[DIVIDE],
            response=reply("Cannot."),
        ),
    ]
    divided = called_tool(
        "divide",
        {"a": 1, "b": 0},
        call=0,
        index=1,
        error="ZeroDivisionError: division by zero",
        agent="planner",
    )
    assert normalize(ro) == recorded(
        calls, spans=["run-2", "run-3"], indexes=[0, 2], tool_steps=[divided], failed=True
    )


def cached_agent(task: JSON, llm: LLM) -> float:
    m = model(llm, cache=InMemoryCache())
    cfg: Any = {"callbacks": [BoltrlCallbackHandler()]}
    first = m.invoke("hi", config=cfg)
    second = m.invoke("hi", config=cfg)  # answered by LangChain's cache
    assert second.content == first.content == "hello"
    return 1.0


def test_a_langchain_cache_hit_is_recorded_cached_and_not_trained() -> None:
    ro = boltrl.run_rollout(cached_agent, {}, backend=ScriptedBackend(["hello", "never"]))
    c = call(
        "call-0",
        agent="ChatOpenAI",
        parent=None,
        messages=[{"role": "user", "content": "hi"}],
        response=reply("hello"),
    )
    got = normalize(ro)
    assert got == {
        "status": "succeeded",
        "reward": 1.0,
        "unjoined_calls": 0,
        "calls": [c],
        "annotations": [
            annotation(c, span="run-0", index=0, call_id="call-0", framework="langchain"),
            annotation(c, span="run-1", index=1, call_id=None, framework="langchain", cached=True),
        ],
        "tool_steps": [],
        "rewards": [],
    }
    assert [t.call_ids for t in boltrl.transitions(ro)] == [[ro.calls[0].id]]


def bare_agent(task: JSON, llm: LLM) -> float:
    graph(llm, [add]).invoke(INPUT)  # no callbacks: only instrument() can see it
    return 1.0


def explicit_agent(task: JSON, llm: LLM) -> float:
    graph(llm, [add]).invoke(INPUT, config={"callbacks": [BoltrlCallbackHandler()]})
    return 1.0


def test_instrument_is_idempotent_and_uninstrument_restores_langchain() -> None:
    before = list(lc_context._configure_hooks)
    try:
        h = boltrl_langchain.instrument()
        assert boltrl_langchain.instrument() is h
        assert boltrl_langchain.installed() is h
        assert len(lc_context._configure_hooks) == len(before) + 1

        ro = boltrl.run_rollout(bare_agent, {}, backend=ScriptedBackend(SCRIPT))
        assert [c.agent for c in ro.calls] == ["planner", "planner", "writer"]
        assert (len(ro.annotations), len(ro.tool_steps), ro.unjoined_calls) == (3, 1, 0)
        # an explicit handler on top of instrument() is not doubled
        ro = boltrl.run_rollout(explicit_agent, {}, backend=ScriptedBackend(SCRIPT))
        assert (len(ro.annotations), len(ro.tool_steps), ro.unjoined_calls) == (3, 1, 0)
    finally:
        boltrl_langchain.uninstrument()
        boltrl_langchain.uninstrument()
    hooks = lc_context._configure_hooks
    assert len(hooks) == len(before) and all(a is b for a, b in zip(hooks, before, strict=True))
    assert boltrl_langchain.installed() is None
    ro = boltrl.run_rollout(bare_agent, {}, backend=ScriptedBackend(SCRIPT))
    assert (len(ro.calls), ro.annotations, ro.tool_steps) == (3, [], [])


def test_outside_a_rollout_it_records_nothing_and_never_raises() -> None:
    before = boltrl_langchain.stats()
    handler = BoltrlCallbackHandler()
    gw = Gateway(ScriptedBackend(SCRIPT), None)
    gw.start()
    try:
        llm = LLM(base_url=f"{gw.url}/v1", model="scripted")
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            out = graph(llm, [add]).invoke(INPUT, config={"callbacks": [handler]})
    finally:
        gw.stop()
    assert out["messages"][-1].content == "Answer: 5"
    assert boltrl_langchain.stats() == before
    assert handler._calls == {} and handler._tools == {}


def test_odd_fields_are_left_empty_and_failures_are_counted_not_raised() -> None:
    attempt = Attempt(
        rollout_id="ro-1",
        number=1,
        worker_id="w",
        started_at=1.0,
        lease_expires_at=2.0,
        last_heartbeat=1.0,
    )
    sunk: list[Any] = []
    h = BoltrlCallbackHandler()
    before = boltrl_langchain.stats()
    ids = [f"00000000-0000-0000-0000-00000000000{i}" for i in range(4)]
    from uuid import UUID

    run = [UUID(i) for i in ids]
    with RolloutContext(attempt, lambda a, recs: sunk.extend(recs)):
        # messages not a list of messages; a metadata node that is not a name; a result
        # that is not an LLMResult: each field fails alone, the call is still recorded
        h.on_chat_model_start({}, [5], run_id=run[0], metadata={"langgraph_node": 7})  # type: ignore[list-item]
        h.on_llm_end(None, run_id=run[0])  # type: ignore[arg-type]
        # a response id that is not a string is no id
        h.on_chat_model_start({"name": "M"}, [[HumanMessage("hi")]], run_id=run[1])
        gen = ChatGeneration(message=AIMessage("yo", response_metadata={"id": 123}))
        h.on_llm_end(LLMResult(generations=[[gen]]), run_id=run[1])
        # a hook that cannot record at all is counted, not raised
        h.on_tool_start({}, "x", run_id=[])  # type: ignore[arg-type]
    after = boltrl_langchain.stats()
    anns = [r for r in sunk if isinstance(r, CallAnnotation)]
    assert [(a.agent, a.request_messages, a.response, a.call_id) for a in anns] == [
        (None, None, None, None),
        (
            "M",
            [{"role": "user", "content": "hi"}],
            {"message": {"role": "assistant", "content": "yo"}, "finish_reason": None},
            None,
        ),
    ]
    assert after["calls"] - before["calls"] == 2
    assert after["field_failures"] - before["field_failures"] == 4
    assert after["failures"] - before["failures"] == 1


def test_two_concurrent_async_rollouts_do_not_mix_records() -> None:
    """Two rollouts in one process, each on its own loop: no cross-talk."""

    async def agent(task: JSON, llm: LLM) -> float:
        h = BoltrlCallbackHandler()
        await model(llm).ainvoke(task["q"], config={"callbacks": [h]})
        return 1.0

    async def both() -> list[Any]:
        from concurrent.futures import ThreadPoolExecutor

        loop = asyncio.get_running_loop()
        with ThreadPoolExecutor(2) as ex:
            futs = [
                loop.run_in_executor(
                    ex,
                    lambda q=q: boltrl.run_rollout(
                        agent, {"q": q}, backend=ScriptedBackend(["ok"])
                    ),
                )
                for q in ("one", "two")
            ]
            return list(await asyncio.gather(*futs))

    for ro, q in zip(asyncio.run(both()), ("one", "two"), strict=True):
        assert ro.unjoined_calls == 0
        assert [a.request_messages for a in ro.annotations] == [[{"role": "user", "content": q}]]
        assert ro.calls[0].agent == "ChatOpenAI"


# -- agent names from LangGraph graph names ------------------------------------------------


def react_agent(llm: LLM) -> CompiledStateGraph:  # type: ignore[type-arg]
    """The most common LangGraph agent, written as its docs write it."""
    with warnings.catch_warnings():  # moved to langchain.agents in LangGraph 1.0; still served
        warnings.simplefilter("ignore")
        from langgraph.prebuilt import create_react_agent

        return create_react_agent(model(llm), [add], name="converter")


REACT_SCRIPT = [{"tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}}]}, "It is 5."]


def react_alone(task: JSON, llm: LLM) -> float:
    react_agent(llm).invoke(INPUT, config={"callbacks": [BoltrlCallbackHandler()]})
    return 1.0


async def react_alone_async(task: JSON, llm: LLM) -> float:
    await react_agent(llm).ainvoke(INPUT, config={"callbacks": [BoltrlCallbackHandler()]})
    return 1.0


@pytest.mark.parametrize("agent", [react_alone, react_alone_async], ids=["invoke", "ainvoke"])
def test_create_react_agent_is_recorded_under_its_name(agent: Any) -> None:
    ro = boltrl.run_rollout(agent, {}, backend=ScriptedBackend(REACT_SCRIPT))
    assert ro.error is None
    tc = tool_call("call_0_0", "add", '{"a": 2, "b": 3}')
    asked = {"role": "assistant", "content": None, "tool_calls": [tc]}
    answered = {"role": "tool", "content": "5", "tool_call_id": "call_0_0"}
    named = {**asked, "name": "converter"}  # the agent names its replies in the history
    calls = [
        call(
            "call-0",
            agent="converter",
            parent="run-0",
            messages=[USER],
            tools=[ADD],
            response=reply(None, [tc]),
        ),
        call(
            "call-1",
            agent="converter",
            parent="run-1",
            messages=[USER, named, answered],
            tools=[ADD],
            response=reply("It is 5."),
        ),
    ]
    added = called_tool("add", {"a": 2, "b": 3}, call=0, index=1, result="5", agent="converter")
    assert normalize(ro) == recorded(
        calls, spans=["run-2", "run-3"], indexes=[0, 2], tool_steps=[added]
    )


def _team(llm: LLM, converter: Any) -> CompiledStateGraph:  # type: ignore[type-arg]
    """converter (a ReAct agent as a node), then writer (a plain node calling the model)."""
    m = model(llm)
    g = StateGraph(MessagesState)
    if isinstance(converter, CompiledStateGraph):
        g.add_node(converter)  # a subgraph node takes the graph's name
    else:
        g.add_node("step", converter)
    g.add_node("writer", lambda s: {"messages": [m.invoke(s["messages"])]})
    first = "converter" if isinstance(converter, CompiledStateGraph) else "step"
    g.add_edge(START, first)
    g.add_edge(first, "writer")
    g.add_edge("writer", END)
    return g.compile()


def react_as_subgraph(task: JSON, llm: LLM) -> float:
    _team(llm, react_agent(llm)).invoke(INPUT, config={"callbacks": [BoltrlCallbackHandler()]})
    return 1.0


def react_in_a_node(task: JSON, llm: LLM) -> float:
    inner = react_agent(llm)
    team = _team(llm, lambda s: inner.invoke(s))
    team.invoke(INPUT, config={"callbacks": [BoltrlCallbackHandler()]})
    return 1.0


@pytest.mark.parametrize("agent", [react_as_subgraph, react_in_a_node], ids=["node", "nested"])
def test_create_react_agent_in_a_graph_keeps_its_name(agent: Any) -> None:
    script = [*REACT_SCRIPT, "Answer: 5"]
    ro = boltrl.run_rollout(agent, {}, backend=ScriptedBackend(script))
    assert ro.error is None
    got = normalize(ro)
    assert [(c["id"], c["agent"]) for c in got["calls"]] == [
        ("call-0", "converter"),
        ("call-1", "converter"),
        ("call-2", "writer"),
    ]
    assert [a["agent"] for a in got["annotations"]] == ["converter", "converter", "writer"]
    assert [(t["name"], t["agent"], t["call_id"]) for t in got["tool_steps"]] == [
        ("add", "converter", "call-0")
    ]
    assert got["unjoined_calls"] == 0


def unnamed_react(task: JSON, llm: LLM) -> float:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from langgraph.prebuilt import create_react_agent

        agent = create_react_agent(model(llm), [add])
    agent.invoke(INPUT, config={"callbacks": [BoltrlCallbackHandler()]})
    return 1.0


def test_an_unnamed_react_agent_keeps_the_node_name() -> None:
    ro = boltrl.run_rollout(unnamed_react, {}, backend=ScriptedBackend(REACT_SCRIPT))
    assert ro.error is None
    assert [c.agent for c in ro.calls] == ["agent", "agent"]
