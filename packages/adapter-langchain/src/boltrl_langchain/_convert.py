"""Pure functions from LangChain objects to the pieces of boltrl records.

No SDK state, no rollout context: every function takes LangChain values and returns
JSON-ready Python values, so each can be tested on its own. Each reads defensively
(``getattr`` with defaults) because callbacks see objects from every LangChain
integration, not only ``ChatOpenAI``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.messages import BaseMessage
from langchain_core.outputs import LLMResult

from boltrl._common import JSON
from boltrl.adapter_support import jsonable

_ROLES = {
    "human": "user",
    "ai": "assistant",
    "system": "system",
    "tool": "tool",
    "function": "function",
    "developer": "developer",
}


def _content(content: Any) -> Any:
    """Message content in OpenAI form: a string, or a list of content parts."""
    if content is None or isinstance(content, str):
        return content
    return jsonable(content)


def _tool_calls(msg: BaseMessage) -> list[JSON]:
    out = []
    for tc in getattr(msg, "tool_calls", None) or ():
        args = tc.get("args", {})
        out.append(
            {
                "id": tc.get("id"),
                "type": "function",
                "function": {
                    "name": tc.get("name"),
                    "arguments": args if isinstance(args, str) else json.dumps(args),
                },
            }
        )
    return out


def message_to_openai(msg: BaseMessage) -> JSON:
    """One LangChain message as an OpenAI chat message (role, content, tool calls…)."""
    kind = getattr(msg, "type", "")
    role = getattr(msg, "role", None) if kind == "chat" else _ROLES.get(kind, kind)
    out: JSON = {"role": role or "user", "content": _content(getattr(msg, "content", None))}
    if kind == "ai":
        calls = _tool_calls(msg)
        if calls:
            out["tool_calls"] = calls
            if out["content"] == "":  # what OpenAI clients send for a tool-call-only turn
                out["content"] = None
    elif kind == "tool":
        out["tool_call_id"] = getattr(msg, "tool_call_id", None)
        return out  # a tool message's ``name`` is LangChain's, not part of the OpenAI turn
    name = getattr(msg, "name", None)
    if name:
        out["name"] = name
    return out


def messages_to_openai(messages: Sequence[Any]) -> list[JSON]:
    """A LangChain prompt (messages, or plain strings from a text LLM) in OpenAI form."""
    return [
        message_to_openai(m) if isinstance(m, BaseMessage) else {"role": "user", "content": str(m)}
        for m in messages
    ]


def first_generation(result: LLMResult) -> Any:
    """The first generation of the first prompt (a callback run has exactly one)."""
    gens = result.generations
    return gens[0][0] if gens and gens[0] else None


def response_id(result: LLMResult) -> str | None:
    """The provider's response id (``chatcmpl-…`` / ``resp_…``), when the integration
    passed it through: ``ChatOpenAI`` puts it in the message's ``response_metadata`` and
    in ``llm_output`` for non-streamed calls; streamed calls carry none."""
    gen = first_generation(result)
    meta = getattr(getattr(gen, "message", None), "response_metadata", None) or {}
    rid = meta.get("id")
    if not rid and result.llm_output:
        rid = result.llm_output.get("id")
    return rid if isinstance(rid, str) and rid else None


def response_of(result: LLMResult) -> JSON:
    """The response as an OpenAI assistant ``message`` plus its ``finish_reason``."""
    gen = first_generation(result)
    if gen is None:
        return {}
    msg = getattr(gen, "message", None)
    message = (
        message_to_openai(msg)
        if isinstance(msg, BaseMessage)
        else {"role": "assistant", "content": getattr(gen, "text", None)}
    )
    message["role"] = "assistant"
    meta = getattr(msg, "response_metadata", None) or {}
    finish = meta.get("finish_reason") or (getattr(gen, "generation_info", None) or {}).get(
        "finish_reason"
    )
    return {"message": message, "finish_reason": finish}


def is_cache_hit(result: LLMResult) -> bool:
    """Whether LangChain answered from its LLM cache (``set_llm_cache`` / ``cache=``).

    langchain-core marks cache hits only by zeroing the cost: it adds
    ``usage_metadata["total_cost"] = 0``, a key no chat integration sets itself.
    """
    gen = first_generation(result)
    usage = getattr(getattr(gen, "message", None), "usage_metadata", None) or {}
    return "total_cost" in usage and usage["total_cost"] == 0


REACT_MODEL_NODE = "agent"
"""The node ``langgraph.prebuilt.create_react_agent`` calls its model from."""
DEFAULT_GRAPH_NAME = "LangGraph"
"""The name of a compiled graph that was given none."""


def agent_name(
    metadata: Mapping[str, Any] | None,
    name: str | None,
    serialized: Mapping[str, Any] | None,
    graph: str | None = None,
) -> str | None:
    """The agent/role of a run: ``metadata["boltrl_agent"]`` if the user set one, else the
    ``create_agent`` name (``lc_agent_name``), else the LangGraph node, else the run name.

    A node named ``agent`` (the prebuilt ReAct agent's model node,
    ``create_react_agent(..., name="converter")``) in a graph with a name of its own
    (``graph``, the name of the graph whose node made the call) is that graph: the node's
    name says nothing, the graph's is the one the user gave the agent.
    """
    md = metadata or {}
    for key in ("boltrl_agent", "lc_agent_name"):
        v = md.get(key)
        if isinstance(v, str) and v:
            return v
    node = md.get("langgraph_node")
    if isinstance(node, str) and node:
        if node == REACT_MODEL_NODE and graph and graph != DEFAULT_GRAPH_NAME:
            return graph
        return node
    return name or serialized_name(serialized)


def serialized_name(serialized: Mapping[str, Any] | None) -> str | None:
    """The class or tool name LangChain put in a run's ``serialized`` dict."""
    if not serialized:
        return None
    name = serialized.get("name")
    if isinstance(name, str) and name:
        return name
    ident = serialized.get("id")
    if isinstance(ident, list) and ident:
        return str(ident[-1])
    return None


def tool_arguments(input_str: str, inputs: Mapping[str, Any] | None) -> Any:
    """A tool's arguments: the ``inputs`` dict when LangChain gave one, else the input
    string (parsed when it is JSON)."""
    if inputs is not None:
        return jsonable(inputs)
    try:
        return json.loads(input_str)
    except (TypeError, ValueError):
        return input_str


def tool_result(output: Any) -> Any:
    """A tool's result: a ``ToolMessage``'s content (or its artifact-less content parts),
    else the output itself as JSON."""
    if isinstance(output, BaseMessage):
        return _content(output.content)
    return jsonable(output)


def tool_call_id_of(output: Any) -> str | None:
    """The ``tool_call_id`` a tool's ``ToolMessage`` answers, if it is one."""
    tcid = getattr(output, "tool_call_id", None)
    return tcid if isinstance(tcid, str) else None


def error_text(error: BaseException) -> str:
    """``Type: message`` of an exception."""
    return f"{type(error).__name__}: {error}"
