"""The OpenAI Agents SDK adapter with the real SDK against a real gateway on 127.0.0.1.

Each agent runs through ``boltrl.run_rollout`` on a ``ScriptedBackend``; each test
compares the whole normalized rollout (every call with its token ids, every annotation,
tool step and reward). The SDK's trace processors are replaced for each test, so the
default exporter never sees a trace (and never uploads one).
"""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Iterator
from functools import partial
from typing import Any, Literal

import adapter_harness
import agents
import pytest
from adapter_harness import call, called_tool, reply, reward, tool_call
from agents import (
    Agent,
    Model,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    RunConfig,
    Runner,
    function_tool,
)
from agents.tracing import get_trace_provider
from openai import AsyncOpenAI

import boltrl
import boltrl_openai_agents
from boltrl.gateway import Gateway
from boltrl.records import LLM, Resources, RolloutStatus, Task
from boltrl.store import open_store
from boltrl.testing import ScriptedBackend
from boltrl_openai_agents import BoltrlTracingProcessor

# the Agents SDK's spans carry the response message only
annotation = partial(adapter_harness.annotation, message_only=True)
normalize = partial(adapter_harness.normalize, refs="span")
recorded = partial(adapter_harness.recorded, framework="openai-agents", message_only=True)

JSON = dict[str, Any]
Api = Literal["chat.completions", "responses"]


def processors() -> tuple[Any, ...]:
    return get_trace_provider()._multi_processor._processors  # type: ignore[attr-defined,no-any-return]


@pytest.fixture(autouse=True)
def only_our_processor(monkeypatch: pytest.MonkeyPatch) -> Iterator[BoltrlTracingProcessor]:
    """Each test sees exactly one fresh processor, no exporter; the list is restored."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    before = processors()
    processor = BoltrlTracingProcessor()
    agents.set_trace_processors([processor])
    try:
        yield processor
    finally:
        get_trace_provider().set_processors(list(before))


@function_tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    boltrl.emit_reward(0.5)
    return a + b


@function_tool(failure_error_function=None)
def explode(a: int, b: int) -> int:
    """Always fails."""
    raise RuntimeError("tool exploded")


def model(llm: LLM, api: Api) -> Model:
    client = AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    if api == "responses":
        return OpenAIResponsesModel(model=llm.model, openai_client=client)
    return OpenAIChatCompletionsModel(model=llm.model, openai_client=client)


def team(llm: LLM, api: Api, tool: Any = add) -> Agent[Any]:
    """triage hands off to math, which has a function tool: two agents and a tool."""
    m = model(llm, api)
    math = Agent(name="math", instructions="You do math.", tools=[tool], model=m)
    return Agent(name="triage", instructions="Route to math.", handoffs=[math], model=m)


def make_agent(api: Api, *, stream: bool, config: RunConfig | None = None) -> Any:
    async def agent(task: JSON, llm: LLM) -> float:
        start = team(llm, api)
        if stream:
            run = Runner.run_streamed(start, task["q"], run_config=config)
            async for _ in run.stream_events():
                pass
        else:
            await Runner.run(start, task["q"], run_config=config)
        return 1.0

    return agent


SCRIPT: list[Any] = [
    {"tool_calls": [{"name": "transfer_to_math", "arguments": {}}]},
    {"tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}}]},
    "The answer is 5.",
]
ROUTE = {"role": "system", "content": "Route to math."}
MATH = {"role": "system", "content": "You do math."}
USER = {"role": "user", "content": "what is 2+3?"}
HANDOFF_TOOL = {
    "type": "function",
    "function": {
        "name": "transfer_to_math",
        "description": "Handoff to the math agent to handle the request. ",
        "parameters": {
            "additionalProperties": False,
            "type": "object",
            "properties": {},
            "required": [],
        },
        "strict": True,
    },
}


def fn_tool(name: str, description: str) -> JSON:
    ints = {"a": {"title": "A", "type": "integer"}, "b": {"title": "B", "type": "integer"}}
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "properties": ints,
                "required": ["a", "b"],
                "title": f"{name}_args",
                "type": "object",
                "additionalProperties": False,
            },
            "strict": True,
        },
    }


ADD_TOOL = fn_tool("add", "Add two numbers.")
HANDOFF = tool_call("call_0_0", "transfer_to_math", "{}")
ADD = tool_call("call_1_0", "add", '{"a": 2, "b": 3}')
HANDED = [
    {"role": "assistant", "content": None, "tool_calls": [HANDOFF]},
    {"role": "tool", "content": '{"assistant": "math"}', "tool_call_id": "call_0_0"},
]
ADDED = [
    {"role": "assistant", "content": None, "tool_calls": [ADD]},
    {"role": "tool", "content": "5", "tool_call_id": "call_1_0"},
]


def expected_calls(api: Api, stream: bool, *, tool: JSON = ADD_TOOL) -> list[JSON]:
    kw: Any = {"api": api, "stream": stream}
    return [
        call(
            "call-0",
            agent="triage",
            parent="span-0",
            messages=[ROUTE, USER],
            tools=[HANDOFF_TOOL],
            response=reply(None, [HANDOFF]),
            **kw,
        ),
        call(
            "call-1",
            agent="math",
            parent="span-1",
            messages=[MATH, USER, *HANDED],
            tools=[tool],
            response=reply(None, [ADD]),
            **kw,
        ),
        call(
            "call-2",
            agent="math",
            parent="span-1",
            messages=[MATH, USER, *HANDED, *ADDED],
            tools=[tool],
            response=reply("The answer is 5."),
            **kw,
        ),
    ][: 3 if tool is ADD_TOOL else 2]


def handoff_step() -> JSON:
    result = {"from_agent": "triage", "to_agent": "math"}
    return called_tool("transfer_to_math", {}, call=0, index=1, result=result, agent="triage")


def add_step(index: int) -> JSON:
    return called_tool("add", {"a": 2, "b": 3}, call=1, index=index, result=5, agent="math")


def call_id_seen(api: Api, stream: bool, label: str) -> str | None:
    """A plain Chat Completions span hides the response id: joined by order and content."""
    return None if api == "chat.completions" and not stream else label


@pytest.mark.parametrize("stream", [False, True], ids=["run", "run_streamed"])
@pytest.mark.parametrize("api", ["chat.completions", "responses"])
def test_handoff_and_tool_are_recorded_whole(api: Api, stream: bool) -> None:
    ro = boltrl.run_rollout(
        make_agent(api, stream=stream), {"q": USER["content"]}, backend=ScriptedBackend(SCRIPT)
    )
    calls = expected_calls(api, stream)
    cid = [call_id_seen(api, stream, f"call-{i}") for i in range(3)]
    assert normalize(ro) == recorded(
        calls,
        spans=["span-2", "span-3", "span-4"],
        indexes=[0, 2, 5],
        tool_steps=[handoff_step(), add_step(index=4)],
        rewards=[reward(0.5, index=3)],
        call_ids=cid,
    )


def test_redacted_spans_still_give_agents_and_tree() -> None:
    """``trace_include_sensitive_data=False`` empties the spans' inputs and outputs: the
    annotations carry no messages and are joined by order alone."""
    agent = make_agent(
        "chat.completions", stream=False, config=RunConfig(trace_include_sensitive_data=False)
    )
    ro = boltrl.run_rollout(agent, {"q": USER["content"]}, backend=ScriptedBackend(SCRIPT))
    calls = expected_calls("chat.completions", False)
    fw = "openai-agents"
    blind: JSON = {"messages": None, "response": None, "call_id": None, "framework": fw}
    assert normalize(ro) == {
        "status": "succeeded",
        "reward": 1.0,
        "unjoined_calls": 0,
        "calls": calls,
        "annotations": [
            annotation(calls[0], span="span-2", index=0, **blind),
            annotation(calls[1], span="span-3", index=2, **blind),
            annotation(calls[2], span="span-4", index=5, **blind),
        ],
        "tool_steps": [
            handoff_step() | {"arguments": None, "tool_call_id": None},
            add_step(index=4) | {"arguments": None, "result": None, "tool_call_id": None},
        ],
        "rewards": [reward(0.5, index=3)],
    }


def test_agent_that_raises_is_failed_with_everything_kept() -> None:
    async def agent(task: JSON, llm: LLM) -> float:
        await Runner.run(team(llm, "responses", tool=explode), task["q"])
        return 1.0

    script = [SCRIPT[0], {"tool_calls": [{"name": "explode", "arguments": {"a": 2, "b": 3}}]}]
    ro = boltrl.run_rollout(agent, {"q": USER["content"]}, backend=ScriptedBackend(script))
    assert ro.error is not None and "tool exploded" in ro.error
    boom = tool_call("call_1_0", "explode", '{"a": 2, "b": 3}')
    calls = expected_calls("responses", False, tool=fn_tool("explode", "Always fails."))
    calls[1] = call(
        "call-1",
        api="responses",
        agent="math",
        parent="span-1",
        messages=calls[1]["request"]["messages"],
        tools=calls[1]["request"]["tools"],
        response=reply(None, [boom]),
    )
    exploded = called_tool(
        "explode",
        {"a": 2, "b": 3},
        call=1,
        index=3,
        error="Error running tool: tool exploded",
        agent="math",
    )
    assert normalize(ro) == recorded(
        calls,
        spans=["span-2", "span-3"],
        indexes=[0, 2],
        tool_steps=[handoff_step(), exploded],
        failed=True,
    )


def test_instrument_twice_then_uninstrument_leaves_the_sdk_as_it_was(
    only_our_processor: BoltrlTracingProcessor,
) -> None:
    before = processors()
    first = boltrl_openai_agents.instrument()
    assert boltrl_openai_agents.instrument() is first
    assert boltrl_openai_agents.installed() is first
    assert processors() == (*before, first)

    ro = boltrl.run_rollout(
        make_agent("responses", stream=False),
        {"q": USER["content"]},
        backend=ScriptedBackend(SCRIPT),
    )
    # both processors saw every span: each call has two annotations, joined once
    assert [c.agent for c in ro.calls] == ["triage", "math", "math"]
    assert len(ro.annotations) == 6 and len(ro.tool_steps) == 4 and ro.unjoined_calls == 0

    boltrl_openai_agents.uninstrument()
    boltrl_openai_agents.uninstrument()
    assert processors() == before
    assert boltrl_openai_agents.installed() is None


def test_outside_a_rollout_nothing_is_recorded_and_nothing_raised(
    only_our_processor: BoltrlTracingProcessor,
) -> None:
    before = boltrl_openai_agents.stats()
    with Gateway(ScriptedBackend(SCRIPT)) as gw, warnings.catch_warnings():
        warnings.simplefilter("error")
        llm = LLM(base_url=f"{gw.url}/v1", model="scripted")
        result = asyncio.run(Runner.run(team(llm, "chat.completions"), USER["content"]))
    assert result.final_output == "The answer is 5."
    assert boltrl_openai_agents.stats() == before
    assert only_our_processor._spans == {} and only_our_processor._traces == {}


def test_concurrent_rollouts_keep_their_own_records() -> None:
    """Trace processors are process-global: spans of rollouts running side by side in
    one process go each to their own rollout."""
    store = open_store("memory://")
    backend = ScriptedBackend(SCRIPT, delay_s=0.02)
    with Gateway(backend, store) as gw:
        store.publish_resources(Resources(gateway_url=gw.url, model="scripted"))
        ids = store.enqueue([Task(input={"q": f"what is {i}+3?"}) for i in range(4)])
        boltrl.Runner(make_agent("chat.completions", stream=False), store, concurrency=4).run(
            max_rollouts=4, exit_when_idle=True
        )
        done = store.wait(ids, timeout_s=30)
    store.close()
    for i, ro in enumerate(done):
        assert ro.status == RolloutStatus.SUCCEEDED
        assert ro.unjoined_calls == 0
        assert [c.agent for c in ro.calls] == ["triage", "math", "math"]
        assert [t.name for t in ro.tool_steps] == ["transfer_to_math", "add"]
        assert [t.parent_id for t in ro.tool_steps] == [c.id for c in ro.calls[:2]]
        for a in ro.annotations:
            assert a.request_messages is not None
            assert a.request_messages[1] == {"role": "user", "content": f"what is {i}+3?"}


def test_an_odd_field_costs_that_field_only(only_our_processor: BoltrlTracingProcessor) -> None:
    """A span whose input cannot be read still gives its annotation (without messages)."""

    def agent(task: JSON, llm: LLM) -> None:
        with agents.trace("odd"), agents.agent_span("solo"):
            with agents.generation_span(input=5, output=[{"role": "assistant", "content": "x"}]):  # type: ignore[arg-type]
                pass
            with agents.function_span("f", input="not json", output=object()):
                pass

    before = boltrl_openai_agents.stats()
    ro = boltrl.run_rollout(agent, {})
    after = boltrl_openai_agents.stats()
    assert ro.status == RolloutStatus.SUCCEEDED
    [ann] = ro.annotations
    assert (ann.agent, ann.request_messages, ann.response) == (
        "solo",
        None,
        {"message": {"role": "assistant", "content": "x"}},
    )
    [step] = ro.tool_steps
    assert (step.name, step.arguments, step.agent) == ("f", "not json", "solo")
    assert isinstance(step.result, str) and step.result.startswith("<object object")
    assert after["field_failures"] == before["field_failures"] + 1
    assert after["failures"] == before["failures"]
    assert ro.unjoined_calls == 1  # an annotation with no gateway call is counted
