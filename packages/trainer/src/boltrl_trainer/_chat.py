"""Chat rendering and tool-call parsing for the TransformersBackend (pure text, no torch).

Tools are rendered by the model's chat template when the template takes a ``tools``
variable. Otherwise (SmolLM2's template, for one) boltrl uses one fallback format, the
widely trained "Hermes" convention that Qwen2.5 also uses:

- the tool schemas go into a system-prompt block (``TOOLS_PROMPT``), appended to the first
  system message or sent as a new one, asking for
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``;
- an assistant message's ``tool_calls`` are written back in that same form after its text;
- ``tool`` results become a user turn of ``<tool_response>…</tool_response>`` blocks
  (consecutive results share one turn).

Replies are parsed the same way in both cases: every ``<tool_call>`` block holding a JSON
object with ``name`` and ``arguments`` (or ``parameters``) becomes an OpenAI tool call; a
block that does not parse stays in the text.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from typing import Any

from boltrl._common import JSON

TOOLS_PROMPT = (
    "# Tools\n\n"
    "You may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n"
    "<tools>\n{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n"
    '<tool_call>\n{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)
"""The fallback tool block (``{tools}`` is replaced by one JSON schema per line)."""

TOOL_CALL_OPEN = "<tool_call>"
"""What opens a tool-call block in a reply (streaming holds text from here on)."""
_TOOL_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def template_supports_tools(template: str) -> bool:
    """Whether a Jinja chat template renders the ``tools`` variable itself."""
    return re.search(r"\btools\b", template) is not None


def template_hash(template: str) -> str:
    """sha256 (hex) of a chat template's text, recorded with every call."""
    return hashlib.sha256(template.encode()).hexdigest()


def _text(content: Any) -> str:
    """OpenAI content (str, None, or a list of parts) as plain text."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, str):
                parts.append(part)
        return "".join(parts)
    return str(content)


def _arguments_object(arguments: Any) -> Any:
    """Tool-call arguments as a JSON value (OpenAI sends a JSON string)."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


def _tool_call_text(call: JSON) -> str:
    fn = call.get("function") or {}
    body = {"name": fn.get("name"), "arguments": _arguments_object(fn.get("arguments", {}))}
    return f"<tool_call>\n{json.dumps(body, ensure_ascii=False)}\n</tool_call>"


def _tool_schema(tool: JSON) -> JSON:
    return tool if "function" in tool else {"type": "function", "function": tool}


def fallback_messages(messages: list[JSON], tools: list[JSON] | None) -> list[JSON]:
    """Messages for a template that knows nothing of tools (see the module docstring)."""
    out: list[JSON] = []
    for msg in messages:
        role = msg.get("role")
        content = _text(msg.get("content"))
        if role == "tool":
            block = f"<tool_response>\n{content}\n</tool_response>"
            if out and out[-1].get("_tool_turn"):
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "_tool_turn": True})
            continue
        if role == "assistant" and msg.get("tool_calls"):
            calls = "\n".join(_tool_call_text(c) for c in msg["tool_calls"])
            content = f"{content}\n{calls}" if content else calls
        out.append({"role": "system" if role == "developer" else role, "content": content})
    for msg in out:
        msg.pop("_tool_turn", None)
    if tools:
        block = TOOLS_PROMPT.format(
            tools="\n".join(json.dumps(_tool_schema(t), ensure_ascii=False) for t in tools)
        )
        if out and out[0]["role"] == "system":
            out[0]["content"] = f"{out[0]['content']}\n\n{block}" if out[0]["content"] else block
        else:
            out.insert(0, {"role": "system", "content": block})
    return out


def native_messages(messages: list[JSON]) -> list[JSON]:
    """Messages for a template that renders tools itself (HF conventions: arguments as objects)."""
    out: list[JSON] = []
    for msg in messages:
        m = dict(msg)
        m["content"] = _text(m.get("content"))
        if m.get("role") == "developer":
            m["role"] = "system"
        if m.get("tool_calls"):
            m["tool_calls"] = [
                {
                    **c,
                    "function": {
                        **(c.get("function") or {}),
                        "arguments": _arguments_object((c.get("function") or {}).get("arguments")),
                    },
                }
                for c in m["tool_calls"]
            ]
        out.append(m)
    return out


def render(
    tokenizer: Any, messages: list[JSON], tools: list[JSON] | None, tool_choice: Any
) -> tuple[str, str]:
    """Render a request into ``(prompt_text, template_hash)``.

    ``tool_choice="none"`` renders no tools. Raises ``ValueError`` (or the template's own
    exception) when the messages cannot be rendered.
    """
    if not messages:
        raise ValueError("messages: at least one message is required")
    use_tools = [_tool_schema(t) for t in tools] if tools and tool_choice != "none" else None
    template = tokenizer.get_chat_template(None, use_tools)
    if template_supports_tools(template):
        prepared, render_tools = native_messages(messages), use_tools
    else:
        prepared, render_tools = fallback_messages(messages, use_tools), None
    text = tokenizer.apply_chat_template(
        prepared, tools=render_tools, tokenize=False, add_generation_prompt=True
    )
    if not isinstance(text, str):  # pragma: no cover - transformers returns str here
        raise TypeError(f"chat template rendered {type(text).__name__}, expected str")
    return text, template_hash(template)


def parse_tool_calls(text: str) -> tuple[str | None, list[JSON]]:
    """Split a reply into ``(content, tool_calls)`` (OpenAI format, arguments a JSON string).

    Content is the text outside parsed ``<tool_call>`` blocks, stripped, or None when empty
    and at least one call was found.
    """
    calls: list[JSON] = []
    kept: list[str] = []
    pos = 0
    for match in _TOOL_CALL_RE.finditer(text):
        try:
            body = json.loads(match.group(1))
        except ValueError:
            continue
        if not isinstance(body, dict) or not isinstance(body.get("name"), str):
            continue
        args = body.get("arguments", body.get("parameters", {}))
        calls.append(
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {
                    "name": body["name"],
                    "arguments": args if isinstance(args, str) else json.dumps(args),
                },
            }
        )
        kept.append(text[pos : match.start()])
        pos = match.end()
    if not calls:
        return text, []
    kept.append(text[pos:])
    content = "".join(kept).strip()
    return content or None, calls
