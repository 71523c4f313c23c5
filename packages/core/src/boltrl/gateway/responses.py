"""The Responses API (the OpenAI Agents SDK's default): request → ``ParsedCall``,
``Generation`` → ``Response`` object or its SSE event sequence.

Input items become chat messages in normal form: ``instructions`` a leading system
message, ``message`` items messages, consecutive ``function_call`` items the
``tool_calls`` of one assistant message, ``function_call_output`` items tool messages;
``reasoning`` items are skipped. The gateway keeps no conversation state, so
``previous_response_id`` and ``conversation`` are refused: send the whole input.
"""

from __future__ import annotations

from typing import Any

from boltrl._common import JSON
from boltrl.gateway import _fields as f
from boltrl.gateway import _messages
from boltrl.gateway._errors import RequestError
from boltrl.gateway._json import dumps
from boltrl.gateway._output import pieces, split, usage_of
from boltrl.gateway._request import ParsedCall
from boltrl.gateway.backend import Generation, GenerationRequest


def parse(body: JSON) -> ParsedCall:
    """Validate a responses body; raises ``RequestError`` naming the field."""
    for key in ("previous_response_id", "conversation", "prompt"):
        if body.get(key) is not None:
            raise RequestError(
                f"'{key}' is not supported: the boltrl gateway keeps no conversation state, "
                "send the whole conversation in 'input'",
                key,
            )
    if body.get("background"):
        raise RequestError("'background' responses are not supported", "background")
    instructions = f.opt_str(body, "instructions")
    msgs: list[JSON] = [{"role": "system", "content": instructions}] if instructions else []
    msgs.extend(_input(body.get("input")))
    tools = _tools(body.get("tools"))
    choice = _messages.tool_choice(body.get("tool_choice"), tools, flat=True)
    f.reject_unsupported(body)
    request = GenerationRequest.model_construct(
        messages=msgs,
        tools=tools,
        tool_choice=choice,
        temperature=f.opt_number(body, "temperature", lo=0.0, hi=2.0),
        top_p=f.opt_number(body, "top_p", lo=0.0, hi=1.0),
        max_tokens=f.opt_int(body, "max_output_tokens", lo=1),
        stop=[],
        seed=f.opt_int(body, "seed"),
        model=f.opt_str(body, "model"),
        rollout_id=None,
    )
    parallel = f.opt_bool(body, "parallel_tool_calls")
    echo: JSON = {
        "instructions": instructions,
        "tools": [{"type": "function", **t["function"]} for t in tools or ()],
        "tool_choice": body.get("tool_choice") or "auto",
        "parallel_tool_calls": True if parallel is None else parallel,
        "max_output_tokens": request.max_tokens,
        "metadata": f.opt_object(body, "metadata") or {},
        "text": f.opt_object(body, "text") or {"format": {"type": "text"}},
        "truncation": f.opt_str(body, "truncation") or "disabled",
        "user": f.opt_str(body, "user"),
        "store": bool(body.get("store", False)),
    }
    return ParsedCall(
        api="responses", request=request, stream=bool(f.opt_bool(body, "stream")), echo=echo
    )


def _input(raw: Any) -> list[JSON]:
    if isinstance(raw, str):
        return [{"role": "user", "content": raw}]
    if raw is None:
        raise RequestError("'input' is required", "input", "missing_required_parameter")
    f.expect(raw, list, "input", "a string or an array of input items")
    if not raw:
        raise RequestError("'input' must contain at least one item", "input")
    msgs: list[JSON] = []
    for i, item in enumerate(raw):
        p = f"input[{i}]"
        f.expect(item, dict, p, "an object")
        kind = item.get("type", "message")
        if kind == "message":
            msgs.append(
                _messages.message({"role": item.get("role"), "content": item.get("content")}, p)
            )
        elif kind == "function_call":
            call = {
                "id": f.expect(item.get("call_id"), str, f"{p}.call_id", "a string"),
                "type": "function",
                "function": {
                    "name": f.expect(item.get("name"), str, f"{p}.name", "a string"),
                    "arguments": f.expect(item.get("arguments"), str, f"{p}.arguments", "a string"),
                },
            }
            # Function calls right after an assistant turn are that turn's tool calls.
            if msgs and msgs[-1]["role"] == "assistant":
                msgs[-1].setdefault("tool_calls", []).append(call)
            else:
                msgs.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id = f.expect(item.get("call_id"), str, f"{p}.call_id", "a string")
            text = _messages.content_text(item.get("output"), f"{p}.output")
            msgs.append({"role": "tool", "tool_call_id": call_id, "content": text})
        elif kind == "reasoning":
            continue
        else:
            raise RequestError(
                f"'{p}.type' {kind!r} is not supported by the boltrl gateway", f"{p}.type"
            )
    return msgs


def _tools(raw: Any) -> list[JSON] | None:
    if raw is None:
        return None
    f.expect(raw, list, "tools", "an array of tools")
    out = []
    for i, t in enumerate(raw):
        p = f"tools[{i}]"
        f.expect(t, dict, p, "an object")
        if t.get("type") != "function":
            raise RequestError(
                f"'{p}.type' {t.get('type')!r} is not supported: only function tools",
                f"{p}.type",
            )
        fn = t["function"] if isinstance(t.get("function"), dict) else t  # chat shape too
        out.append(_messages.function_tool(fn.get("name"), fn, p))
    return out or None


def _items(resp_id: str, gen: Generation, *, done: bool = True) -> list[JSON]:
    status = "completed" if done else "in_progress"
    hexid = resp_id.removeprefix("resp_")
    items: list[JSON] = []
    if gen.text or not gen.tool_calls:  # a turn with neither still answers (empty text)
        text = (gen.text or "") if done else ""
        part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
        items.append(
            {
                "id": f"msg_{hexid}",
                "type": "message",
                "role": "assistant",
                "status": status,
                "content": [part] if done else [],
            }
        )
    for i, tc in enumerate(gen.tool_calls):
        fn = tc["function"]
        items.append(
            {
                "id": f"fc_{hexid}_{i}",
                "type": "function_call",
                "status": status,
                "call_id": tc["id"],
                "name": fn["name"],
                "arguments": fn["arguments"] if done else "",
            }
        )
    return items


def response(
    resp_id: str, created: int, model: str, gen: Generation, call: ParsedCall, *, done: bool = True
) -> JSON:
    """The ``response`` object; ``done=False`` gives the in-progress one streams open with."""
    incomplete = done and gen.finish_reason == "length"
    r = call.request
    u = usage_of(gen)
    return {
        "id": resp_id,
        "object": "response",
        "created_at": created,
        "completed_at": created if done else None,
        "status": ("incomplete" if incomplete else "completed") if done else "in_progress",
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "model": model,
        "output": _items(resp_id, gen) if done else [],
        "temperature": r.temperature,
        "top_p": r.top_p,
        "usage": {
            "input_tokens": u["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": u["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": u["total_tokens"],
        }
        if done
        else None,
        **call.echo,
    }


class ResponseStream:
    """Writes one streamed response's SSE events, in OpenAI's order (``stream`` writes
    them all at once from a finished turn; the gateway's live streaming writes them as the
    backend's text arrives): ``start`` (``response.created``, ``response.in_progress``);
    ``open_text`` (the message item's ``output_item.added`` and ``content_part.added``)
    and ``text`` (``output_text.delta``) while text streams; ``end`` (the rest of each
    output item: for text ``output_text.done`` and ``content_part.done``, for a call
    ``function_call_arguments.delta``… and ``.done``; ``output_item.done``; then
    ``response.completed`` or ``response.incomplete``)."""

    def __init__(self, resp_id: str, created: int, model: str, call: ParsedCall) -> None:
        self.resp_id, self.created, self.model, self.call = resp_id, created, model, call
        self.seq = 0
        self.opened = False
        """Whether ``open_text`` was written (the message item is then output 0)."""

    def _event(self, kind: str, **data: Any) -> bytes:
        data = {"type": kind, "sequence_number": self.seq, **data}
        self.seq += 1
        return b"event: " + kind.encode() + b"\ndata: " + dumps(data) + b"\n\n"

    def _at(self) -> JSON:
        return {"item_id": f"msg_{self.resp_id.removeprefix('resp_')}", "output_index": 0}

    def start(self) -> bytes:
        opening = response(
            self.resp_id, self.created, self.model, Generation(text=None), self.call, done=False
        )
        return self._event("response.created", response=opening) + self._event(
            "response.in_progress", response=opening
        )

    def open_text(self) -> bytes:
        """Open the message item (output 0) whose text ``text`` then streams."""
        self.opened = True
        [item] = _items(self.resp_id, Generation(text="x"), done=False)
        empty = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        return self._event("response.output_item.added", output_index=0, item=item) + self._event(
            "response.content_part.added", **self._at(), content_index=0, part=empty
        )

    def text(self, piece: str) -> bytes:
        return self._event(
            "response.output_text.delta", **self._at(), content_index=0, delta=piece, logprobs=[]
        )

    def end(self, gen: Generation, sent: str = "") -> bytes:
        """The rest of the turn; ``sent`` is the text already written by ``text``."""
        out: list[bytes] = []
        pending = _items(self.resp_id, gen, done=False)
        for index, (item, final) in enumerate(zip(pending, _items(self.resp_id, gen), strict=True)):
            at = {"item_id": item["id"], "output_index": index}
            if not (self.opened and index == 0):
                out.append(self._event("response.output_item.added", output_index=index, item=item))
            if item["type"] == "message":
                part = final["content"][0]
                if not self.opened:
                    empty = {**part, "text": ""}
                    out.append(
                        self._event(
                            "response.content_part.added", **at, content_index=0, part=empty
                        )
                    )
                out.extend(self.text(p) for p in pieces(part["text"][len(sent) :]))
                out.append(
                    self._event(
                        "response.output_text.done",
                        **at,
                        content_index=0,
                        text=part["text"],
                        logprobs=[],
                    )
                )
                out.append(
                    self._event("response.content_part.done", **at, content_index=0, part=part)
                )
            else:
                for piece in split(final["arguments"]):
                    out.append(
                        self._event("response.function_call_arguments.delta", **at, delta=piece)
                    )
                out.append(
                    self._event(
                        "response.function_call_arguments.done",
                        **at,
                        name=final["name"],
                        arguments=final["arguments"],
                    )
                )
            out.append(self._event("response.output_item.done", output_index=index, item=final))
        completed = response(self.resp_id, self.created, self.model, gen, self.call)
        incomplete = completed["status"] == "incomplete"
        kind = "response.incomplete" if incomplete else "response.completed"
        out.append(self._event(kind, response=completed))
        return b"".join(out)


def stream(resp_id: str, created: int, model: str, gen: Generation, call: ParsedCall) -> bytes:
    """The whole SSE body of a streamed response from a finished turn, its text cut in
    pieces (see ``ResponseStream`` for the event order)."""
    w = ResponseStream(resp_id, created, model, call)
    return w.start() + w.end(gen)
