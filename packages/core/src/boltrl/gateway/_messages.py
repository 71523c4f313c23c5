"""Normalize OpenAI chat messages and tools into the one form backends and records use.

Normal form (what ``GenerationRequest.messages`` and ``LLMCall.request`` hold):

- ``{"role": "system" | "user" | "assistant" | "tool", "content": str | None, ...}``;
  ``developer`` becomes ``system``.
- Content given as parts is joined into one string, text parts separated by ``"\\n"``
  (as vLLM renders them); non-text parts (images, audio, files) are refused with a 400,
  since the gateway serves text models.
- Assistant ``tool_calls`` are ``{"id", "type": "function", "function": {"name",
  "arguments"}}`` with ``arguments`` a JSON string; ``content`` is None when absent.
- Tool results keep ``tool_call_id``; ``name`` is kept on any message that has one.
"""

from __future__ import annotations

from typing import Any

from boltrl._common import JSON
from boltrl.gateway._errors import RequestError
from boltrl.gateway._fields import expect
from boltrl.gateway._json import dumps_str

_TEXT_PARTS = ("text", "input_text", "output_text")
_ROLES = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
}


def content_text(content: Any, param: str, *, nullable: bool = False) -> str | None:
    """A message's content as one string (see the module docstring for parts)."""
    if isinstance(content, str):
        return content
    if content is None:
        if nullable:
            return None
        raise RequestError(f"'{param}' is required", param)
    expect(content, list, param, "a string or an array of content parts")
    texts = []
    for i, part in enumerate(content):
        p = f"{param}[{i}]"
        expect(part, dict, p, "an object")
        kind = part.get("type")
        if kind in _TEXT_PARTS:
            texts.append(expect(part.get("text"), str, f"{p}.text", "a string"))
        elif kind == "refusal":
            texts.append(expect(part.get("refusal"), str, f"{p}.refusal", "a string"))
        else:
            raise RequestError(
                f"'{p}.type' {kind!r} is not supported: the boltrl gateway serves text "
                "models (text parts only)",
                f"{p}.type",
            )
    return "\n".join(texts)


def tool_call(raw: Any, param: str) -> JSON:
    """One assistant tool call in normal form."""
    expect(raw, dict, param, "an object")
    kind = raw.get("type", "function")
    if kind != "function":
        raise RequestError(f"'{param}.type' must be 'function', got {kind!r}", f"{param}.type")
    call_id = expect(raw.get("id"), str, f"{param}.id", "a string")
    fn = expect(raw.get("function"), dict, f"{param}.function", "an object")
    name = expect(fn.get("name"), str, f"{param}.function.name", "a string")
    args = fn.get("arguments", "")
    if isinstance(args, dict):  # some clients send parsed arguments; the wire form is a string
        args = dumps_str(args)
    expect(args, str, f"{param}.function.arguments", "a JSON string")
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


def message(raw: Any, param: str) -> JSON:
    """One chat message in normal form."""
    expect(raw, dict, param, "an object")
    given = raw.get("role")
    role = _ROLES.get(given) if isinstance(given, str) else None
    if role is None:
        raise RequestError(
            f"'{param}.role' must be one of system, developer, user, assistant, tool; "
            f"got {raw.get('role')!r}",
            f"{param}.role",
        )
    out: JSON = {"role": role}
    out["content"] = content_text(
        raw.get("content"), f"{param}.content", nullable=role == "assistant"
    )
    name = raw.get("name")
    if name is not None:
        out["name"] = expect(name, str, f"{param}.name", "a string")
    if role == "assistant":
        calls = raw.get("tool_calls")
        if calls:
            expect(calls, list, f"{param}.tool_calls", "an array")
            out["tool_calls"] = [
                tool_call(c, f"{param}.tool_calls[{i}]") for i, c in enumerate(calls)
            ]
    elif role == "tool":
        out["tool_call_id"] = expect(
            raw.get("tool_call_id"), str, f"{param}.tool_call_id", "a string"
        )
    return out


def messages(raw: Any, param: str = "messages") -> list[JSON]:
    """The ``messages`` array in normal form; must be non-empty."""
    if raw is None:
        raise RequestError(f"'{param}' is required", param, "missing_required_parameter")
    expect(raw, list, param, "an array of messages")
    if not raw:
        raise RequestError(f"'{param}' must contain at least one message", param)
    return [message(m, f"{param}[{i}]") for i, m in enumerate(raw)]


def function_tool(name: Any, fn: JSON, param: str) -> JSON:
    """A chat-format function tool from its parts (shared by chat and responses)."""
    expect(name, str, f"{param}.name", "a string")
    if not name:
        raise RequestError(f"'{param}.name' must not be empty", f"{param}.name")
    out: JSON = {"name": name}
    desc = fn.get("description")
    if desc is not None:
        out["description"] = expect(desc, str, f"{param}.description", "a string")
    params = fn.get("parameters")
    if params is not None:
        out["parameters"] = expect(params, dict, f"{param}.parameters", "a JSON schema object")
    if fn.get("strict") is not None:
        out["strict"] = expect(fn["strict"], bool, f"{param}.strict", "a boolean")
    return {"type": "function", "function": out}


def chat_tools(raw: Any) -> list[JSON] | None:
    """Chat ``tools`` in normal form (function tools only); None when absent or empty."""
    if raw is None:
        return None
    expect(raw, list, "tools", "an array of tools")
    out = []
    for i, t in enumerate(raw):
        p = f"tools[{i}]"
        expect(t, dict, p, "an object")
        if t.get("type", "function") != "function":
            raise RequestError(f"'{p}.type' must be 'function', got {t.get('type')!r}", f"{p}.type")
        fn = expect(t.get("function"), dict, f"{p}.function", "an object")
        out.append(function_tool(fn.get("name"), fn, f"{p}.function"))
    return out or None


def tool_choice(raw: Any, tools: list[JSON] | None, *, flat: bool = False) -> Any:
    """``tool_choice`` checked against ``tools``; returned in chat form.

    ``flat`` accepts the Responses shape ``{"type": "function", "name": ...}``.
    """
    if raw is None:
        return None
    if isinstance(raw, str):
        if raw not in ("none", "auto", "required"):
            raise RequestError(
                f"'tool_choice' must be 'none', 'auto', 'required' or a function, got {raw!r}",
                "tool_choice",
            )
        if raw == "required" and not tools:
            raise RequestError("'tool_choice' is 'required' but no tools were given", "tool_choice")
        return raw
    expect(raw, dict, "tool_choice", "a string or an object")
    if raw.get("type") != "function":
        raise RequestError(
            f"'tool_choice.type' must be 'function', got {raw.get('type')!r}", "tool_choice.type"
        )
    if flat and "name" in raw:
        name = raw["name"]
        param = "tool_choice.name"
    else:
        fn = expect(raw.get("function"), dict, "tool_choice.function", "an object")
        name, param = fn.get("name"), "tool_choice.function.name"
    expect(name, str, param, "a string")
    if not any(t["function"]["name"] == name for t in tools or ()):
        raise RequestError(f"'{param}' names {name!r}, which is not among 'tools'", param)
    return {"type": "function", "function": {"name": name}}
