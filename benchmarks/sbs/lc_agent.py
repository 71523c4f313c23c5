"""The agent both sides run: a LangGraph tool loop over ``ChatOpenAI``.

A planner node (the chat model with one tool bound) and a tool node, looping until the
model answers without a tool call. Against the common upstream (``upstream.py``), a
question tagged ``[tools=N]`` makes N tool calls before the answer: N + 1 model calls.
Only LangChain/LangGraph are imported here; each side adds its own capture around it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from langchain_core.tools import StructuredTool
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

MODEL = "scripted"
SYSTEM = (
    "You are a careful travel assistant. Look facts up with the lookup tool before you "
    "answer, quote the readings you used, and keep the answer short and specific."
)


def question(i: int, tools: int) -> str:
    return (
        f"What is the weather in Paris on day {i}, and should I pack an umbrella? [tools={tools}]"
    )


def build(base_url: str, on_tool: Callable[[], None] | None = None) -> Any:
    """The compiled graph talking to ``base_url``; ``on_tool`` runs inside each tool call
    (where an agent would emit an intermediate reward)."""

    def lookup(city: str, step: int = 0) -> str:
        """Look up today's weather reading for a city."""
        if on_tool is not None:
            on_tool()
        return f"{city}: sunny, 24 C, light wind (reading {step})"

    tool = StructuredTool.from_function(lookup)
    model = ChatOpenAI(base_url=base_url, api_key="bench", model=MODEL, max_retries=0)  # type: ignore[arg-type]
    planner = model.bind_tools([tool])

    def plan(state: MessagesState) -> dict[str, Any]:
        return {"messages": [planner.invoke([("system", SYSTEM), *state["messages"]])]}

    g = StateGraph(MessagesState)
    g.add_node("planner", plan)
    g.add_node("tools", ToolNode([tool]))
    g.add_edge(START, "planner")
    g.add_conditional_edges("planner", tools_condition, {"tools": "tools", END: END})
    g.add_edge("tools", "planner")
    return g.compile()


def run(graph: Any, i: int, tools: int, callbacks: list[Any]) -> int:
    """One agent run; returns the number of messages it ended with."""
    out = graph.invoke(
        {"messages": [("user", question(i, tools))]}, config={"callbacks": callbacks}
    )
    return len(out["messages"])
