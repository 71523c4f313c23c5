"""Pure functions from Agents SDK span data to boltrl's OpenAI-form pieces.

No SDK import: span data arrives as the SDK built it (dicts for Chat Completions
spans, openai ``Response`` objects and input-item dicts for Responses spans), and each
function reads only what it needs, so one odd field costs that field only.

Three shapes of model output reach a trace processor:

- ``GenerationSpanData.output`` of a plain Chat Completions call: ``[message.model_dump()]``
  (an assistant chat message; the response id is not exposed);
- ``GenerationSpanData.output`` of a streamed Chat Completions call: ``[response dump]``,
  a Responses-API object the SDK synthesizes (id ``__fake_id__``) whose output items
  carry ``provider_data.response_id``, the real ``chatcmpl-…`` id;
- ``ResponseSpanData.response``: the Responses API ``Response`` (``id`` = ``resp_…``,
  ``instructions`` = the system prompt, which the span's ``input`` leaves out).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from boltrl._common import JSON
from boltrl.adapter_support import json_or_str
from boltrl.adapter_support import parse_arguments as parse_arguments

FAKE_ID = "__fake_id__"
"""The SDK's placeholder id on Responses objects it builds from Chat Completions."""

jsonable = json_or_str
"""``value`` when it survives JSON, else its ``str``."""


def get(obj: Any, key: str) -> Any:
    """``obj[key]`` of a mapping, ``obj.key`` of anything else (None when absent)."""
    if isinstance(obj, Mapping):
        return obj.get(key)
    return getattr(obj, key, None)


def as_dict(obj: Any) -> JSON:
    """A pydantic model or mapping as a plain dict ({} for anything else)."""
    if isinstance(obj, Mapping):
        return dict(obj)
    dump = getattr(obj, "model_dump", None)
    if callable(dump):
        out = dump(mode="json", exclude_none=False)
        return out if isinstance(out, dict) else {}
    return {}


def span_time(iso: str | None) -> float | None:
    """A span's ISO-8601 timestamp as Unix time."""
    if not iso:
        return None
    return datetime.fromisoformat(iso).timestamp()


def content_text(content: Any) -> str | None:
    """Message content as one string; content parts joined by ``\\n`` like the gateway."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, Iterable):
        texts = []
        for part in content:
            text = get(part, "text")
            if text is None:
                text = get(part, "refusal")
            if isinstance(text, str):
                texts.append(text)
        return "\n".join(texts)
    return str(content)


def _tool_call(call_id: Any, name: Any, arguments: Any) -> JSON:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": arguments if isinstance(arguments, str) else ""},
    }


def chat_message(raw: Any) -> JSON:
    """A chat message in the gateway's normal form (None-valued extras dropped)."""
    m = as_dict(raw)
    role = m.get("role") or "assistant"
    out: JSON = {"role": "system" if role == "developer" else role}
    out["content"] = content_text(m.get("content"))
    calls = [as_dict(tc) for tc in m.get("tool_calls") or ()]
    if calls:
        out["tool_calls"] = [
            _tool_call(
                tc.get("id"),
                as_dict(tc.get("function")).get("name"),
                as_dict(tc.get("function")).get("arguments"),
            )
            for tc in calls
        ]
    for key in ("tool_call_id", "name"):
        if m.get(key) is not None:
            out[key] = m[key]
    return out


def chat_messages(raw: Sequence[Any] | None) -> list[JSON] | None:
    """A Chat Completions request's messages (``GenerationSpanData.input``)."""
    if raw is None:
        return None
    return [chat_message(m) for m in raw]


def input_messages(items: str | Sequence[Any] | None, instructions: str | None) -> list[JSON]:
    """Responses API input items as chat messages, as the gateway reads them: the
    instructions a leading system message, ``function_call`` items the tool calls of
    one assistant message, ``function_call_output`` items tool messages; reasoning and
    other non-message items are left out."""
    msgs: list[JSON] = [{"role": "system", "content": instructions}] if instructions else []
    if isinstance(items, str):
        return [*msgs, {"role": "user", "content": items}]
    for raw in items or ():
        item = as_dict(raw)
        kind = item.get("type") or "message"
        if kind == "message":
            role = item.get("role") or "user"
            msgs.append(
                {
                    "role": "system" if role == "developer" else role,
                    "content": content_text(item.get("content")),
                }
            )
        elif kind == "function_call":
            call = _tool_call(item.get("call_id"), item.get("name"), item.get("arguments"))
            if msgs and msgs[-1]["role"] == "assistant":
                msgs[-1].setdefault("tool_calls", []).append(call)
            else:
                msgs.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            msgs.append(
                {
                    "role": "tool",
                    "tool_call_id": item.get("call_id"),
                    "content": content_text(item.get("output")),
                }
            )
    return msgs


def output_message(items: Sequence[Any] | None) -> JSON:
    """Responses API output items as one assistant chat message."""
    texts: list[str] = []
    calls: list[JSON] = []
    for item in items or ():
        kind = get(item, "type")
        if kind == "message":
            text = content_text(get(item, "content"))
            if text:
                texts.append(text)
        elif kind == "function_call":
            calls.append(
                _tool_call(get(item, "call_id"), get(item, "name"), get(item, "arguments"))
            )
    out: JSON = {"role": "assistant", "content": "".join(texts) if texts else None}
    if calls:
        out["tool_calls"] = calls
    return out


def _is_response(obj: JSON) -> bool:
    return obj.get("object") == "response" or ("output" in obj and "role" not in obj)


def generation_output(output: Sequence[Any] | None) -> tuple[JSON | None, str | None]:
    """``GenerationSpanData.output`` as (assistant message, response id if exposed)."""
    if not output:
        return None, None
    first = as_dict(output[0])
    if not _is_response(first):
        return chat_message(first), None
    items = first.get("output") or []
    rid = first.get("id") if first.get("id") not in (None, FAKE_ID) else None
    for item in items:
        pd = as_dict(as_dict(item).get("provider_data"))
        if isinstance(pd.get("response_id"), str):
            rid = pd["response_id"]
            break
    return output_message(items), rid


def tool_calls_of(message: JSON | None) -> list[JSON]:
    """The ``{"id", "name", "arguments"}`` of each tool call in an assistant message."""
    out = []
    for tc in (message or {}).get("tool_calls") or ():
        fn = tc.get("function") or {}
        out.append({"id": tc.get("id"), "name": fn.get("name"), "arguments": fn.get("arguments")})
    return out


def match_tool_call(
    calls: Sequence[JSON], used: set[int], name: str | None, arguments: Any
) -> JSON | None:
    """The first unused tool call with this name (and these arguments, if any has them);
    marks it used."""
    candidates = [i for i, c in enumerate(calls) if i not in used and c.get("name") == name]
    exact = [i for i in candidates if calls[i].get("arguments") == arguments]
    if not (exact or candidates):
        return None
    pick = (exact or candidates)[0]
    used.add(pick)
    return calls[pick]


def span_error(error: Any) -> str | None:
    """A span's ``SpanError`` (``{"message", "data"}``) as one line."""
    if not error:
        return None
    e = as_dict(error)
    data = as_dict(e.get("data"))
    detail = data.get("error")
    message = e.get("message")
    if detail and message:
        return f"{message}: {detail}"
    return str(detail or message or error)


def instructions_text(instructions: Any) -> str | None:
    """A Response's ``instructions`` (a string, or input items) as system-prompt text."""
    if instructions is None or isinstance(instructions, str):
        return instructions
    return "\n".join(
        t for m in input_messages(instructions, None) if isinstance(t := m.get("content"), str)
    )


def handoff_tool_name(agent_name: str) -> str:
    """The SDK's default handoff tool name for an agent (``transfer_to_<snake_name>``)."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", f"transfer_to_{agent_name}").lower()
