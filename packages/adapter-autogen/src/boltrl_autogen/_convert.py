"""Pure functions from AutoGen's event-log payloads to boltrl's OpenAI-form pieces.

No SDK import. What the events carry (autogen-core / autogen-ext 0.7):

- ``LLMCallEvent.kwargs``: ``messages`` (the OpenAI request messages), ``response`` (the
  whole ``ChatCompletion`` dump: its ``id`` is the gateway's response id), ``tools``,
  ``agent_id`` (``"type/key"`` inside a runtime message handler, else None);
- ``LLMStreamStartEvent.kwargs``: ``messages``, ``agent_id``;
- ``LLMStreamEndEvent.kwargs``: ``response`` (a ``CreateResult`` dump: ``content`` is the
  text or a list of ``{"id", "name", "arguments"}`` calls, ``thought`` the text that came
  with calls; no response id), ``agent_id``;
- ``ToolCallEvent.kwargs``: ``tool_name``, ``arguments`` (a dict), ``result`` (a string),
  ``agent_id``; logged only when a tool returns;
- AgentChat's ``ToolCallRequestEvent`` / ``ToolCallExecutionEvent``: ``source`` (the agent
  name) and ``content`` (``FunctionCall(id, name, arguments)`` /
  ``FunctionExecutionResult(call_id, name, content, is_error)``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from boltrl._common import JSON
from boltrl.adapter_support import parse_arguments as parse_arguments


def get(obj: Any, key: str) -> Any:
    """``obj[key]`` of a mapping, ``obj.key`` of anything else (None when absent)."""
    if isinstance(obj, Mapping):
        return obj.get(key)
    return getattr(obj, key, None)


def agent_name(agent_id: Any) -> str | None:
    """An agent's name from its runtime id ``"type/key"``. AgentChat registers each team
    member as type ``"{name}_{team_id}"`` with key ``team_id``; the suffix is dropped."""
    if not isinstance(agent_id, str) or not agent_id:
        return None
    kind, _, key = agent_id.partition("/")
    if key and kind.endswith(f"_{key}"):
        return kind[: -len(key) - 1]
    return kind


def content_text(content: Any) -> str | None:
    """Message content as one string; text parts joined by ``\\n`` like the gateway."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, Iterable):
        texts = [t for p in content if isinstance(t := get(p, "text"), str)]
        return "\n".join(texts)
    return str(content)


def _tool_call(call_id: Any, name: Any, arguments: Any) -> JSON:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


def chat_message(raw: Any) -> JSON:
    """A chat message in the gateway's normal form (None-valued extras dropped)."""
    role = get(raw, "role") or "assistant"
    out: JSON = {"role": "system" if role == "developer" else role}
    out["content"] = content_text(get(raw, "content"))
    calls = get(raw, "tool_calls") or ()
    if calls:
        fns = [(get(tc, "id"), get(tc, "function")) for tc in calls]
        out["tool_calls"] = [_tool_call(i, get(fn, "name"), get(fn, "arguments")) for i, fn in fns]
    for key in ("tool_call_id", "name"):
        if get(raw, key) is not None:
            out[key] = get(raw, key)
    return out


def request_messages(raw: Sequence[Any] | None) -> list[JSON] | None:
    """The request messages of an LLM call or stream-start event."""
    if raw is None:
        return None
    return [chat_message(m) for m in raw]


def completion_message(response: Any) -> JSON | None:
    """The assistant message of a ``ChatCompletion`` dump (its first choice)."""
    choices = get(response, "choices")
    if not choices:
        return None
    return chat_message(get(choices[0], "message"))


def completion_id(response: Any) -> str | None:
    rid = get(response, "id")
    return rid if isinstance(rid, str) else None


def create_result_message(result: Any) -> JSON | None:
    """The assistant message of a ``CreateResult`` dump (a streamed call's end)."""
    if result is None:
        return None
    content = get(result, "content")
    if isinstance(content, list):
        calls = [_tool_call(get(c, "id"), get(c, "name"), get(c, "arguments")) for c in content]
        thought = get(result, "thought")
        return {
            "role": "assistant",
            "content": thought if isinstance(thought, str) else None,
            "tool_calls": calls,
        }
    return {"role": "assistant", "content": content_text(content)}


def tool_call_ids(message: JSON | None) -> list[str]:
    """The ids of the tool calls an assistant message asks for."""
    return [
        tc["id"] for tc in (message or {}).get("tool_calls") or () if isinstance(tc.get("id"), str)
    ]
