"""Span names and attributes of the OpenTelemetry GenAI semantic conventions for model
calls and tool steps (pure functions; no OpenTelemetry import needed)."""

from __future__ import annotations

import json
from typing import Any

from boltrl.dashboard.tree import Node
from boltrl.records import LLMCall, ToolStep

PROVIDER = "boltrl"
"""``gen_ai.provider.name`` of calls served through the boltrl gateway."""


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(p.get("text", p.get("content", ""))) if isinstance(p, dict) else str(p)
            for p in content
        )
    return json.dumps(content)


def _args(raw: Any) -> Any:
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    return raw


def message_parts(m: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI chat message in the conventions' message form (role + typed parts)."""
    role = str(m.get("role", "user"))
    parts: list[dict[str, Any]] = []
    if role == "tool":
        parts.append(
            {
                "type": "tool_call_response",
                "id": m.get("tool_call_id"),
                "response": _text(m.get("content")),
            }
        )
    elif m.get("content") not in (None, "", []):
        parts.append({"type": "text", "content": _text(m.get("content"))})
    for tc in m.get("tool_calls") or []:
        fn = tc.get("function") or {}
        parts.append(
            {
                "type": "tool_call",
                "id": tc.get("id"),
                "name": fn.get("name"),
                "arguments": _args(fn.get("arguments")),
            }
        )
    return {"role": role, "parts": parts}


def call_attributes(
    node: Node, rollout_id: str, content: bool
) -> tuple[str, dict[str, Any], str | None]:
    """Span name, attributes and error (None when ok) of a model call node."""
    c = node.record
    assert isinstance(c, LLMCall)
    req, resp = c.request, c.response
    model = req.get("model") or c.model
    attrs: dict[str, Any] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": PROVIDER,
        "gen_ai.system": PROVIDER,
        "gen_ai.request.model": model,
        "gen_ai.response.model": c.model,
        "gen_ai.response.id": c.id,
        "gen_ai.conversation.id": rollout_id,
        "gen_ai.agent.name": c.agent,
        "gen_ai.request.temperature": req.get("temperature"),
        "gen_ai.request.top_p": req.get("top_p"),
        "gen_ai.request.max_tokens": req.get("max_tokens"),
        "gen_ai.request.seed": req.get("seed"),
        "gen_ai.usage.input_tokens": c.usage.get("prompt_tokens"),
        "gen_ai.usage.output_tokens": c.usage.get("completion_tokens"),
        "boltrl.call.attempt": c.attempt,
        "boltrl.call.cached": c.cached,
        "boltrl.policy_version": c.policy_version,
        "boltrl.template_hash": c.template_hash,
    }
    stop = req.get("stop")
    if stop:
        attrs["gen_ai.request.stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
    finish = resp.get("finish_reason")
    if finish:
        attrs["gen_ai.response.finish_reasons"] = [str(finish)]
    if content:
        raw = req.get("messages")
        messages: list[Any] = raw if isinstance(raw, list) else []
        attrs["gen_ai.input.messages"] = json.dumps([message_parts(m) for m in messages])
        message = resp.get("message")
        if isinstance(message, dict):
            out = message_parts(message) | {"finish_reason": finish}
            attrs["gen_ai.output.messages"] = json.dumps([out])
        tools = req.get("tools")
        if isinstance(tools, list) and tools:
            attrs["gen_ai.tool.definitions"] = json.dumps(tools)
    error = (c.error or "failed") if c.status == "failed" else None
    if error:
        attrs["error.type"] = (c.error or "backend_error").split(":", 1)[0]
    name = f"chat {model}" if model else "chat"
    return name, attrs, error


def tool_attributes(node: Node, content: bool) -> tuple[str, dict[str, Any], str | None]:
    """Span name, attributes and error (None when ok) of a tool step node."""
    t = node.record
    assert isinstance(t, ToolStep)
    attrs: dict[str, Any] = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": t.name,
        "gen_ai.tool.type": "function",
        "gen_ai.tool.call.id": t.tool_call_id,
        "gen_ai.agent.name": t.agent,
        "boltrl.tool.call_id": t.call_id,
    }
    if content:
        attrs["gen_ai.tool.call.arguments"] = (
            t.arguments if isinstance(t.arguments, str) else json.dumps(t.arguments)
        )
        if t.error is None:
            attrs["gen_ai.tool.call.result"] = (
                t.result if isinstance(t.result, str) else json.dumps(t.result)
            )
    if t.error is not None:
        attrs["error.type"] = "tool_error"
    return f"execute_tool {t.name}", attrs, t.error
