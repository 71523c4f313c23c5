"""The Chat Completions API: request → ``ParsedCall``, ``Generation`` → response or SSE.

Responses follow OpenAI's shapes exactly (``chat.completion`` and
``chat.completion.chunk``), plus vLLM's ``return_token_ids`` extension so one boltrl
gateway can serve as another's upstream with exact token ids.
"""

from __future__ import annotations

from boltrl._common import JSON
from boltrl.gateway import _fields as f
from boltrl.gateway import _messages
from boltrl.gateway._errors import RequestError
from boltrl.gateway._json import dumps
from boltrl.gateway._output import assistant_message, pieces, split, usage_of
from boltrl.gateway._request import ParsedCall
from boltrl.gateway.backend import Generation, GenerationRequest


def parse(body: JSON) -> ParsedCall:
    """Validate a chat-completions body; raises ``RequestError`` naming the field."""
    msgs = _messages.messages(body.get("messages"))
    tools = _messages.chat_tools(body.get("tools"))
    choice = _messages.tool_choice(body.get("tool_choice"), tools)
    n = f.opt_int(body, "n", lo=1)
    if n is not None and n != 1:
        raise RequestError("'n' must be 1: the boltrl gateway returns one choice", "n")
    f.reject_unsupported(body)
    max_tokens = f.opt_int(body, "max_completion_tokens", lo=1)
    if max_tokens is None:
        max_tokens = f.opt_int(body, "max_tokens", lo=1)
    stream = bool(f.opt_bool(body, "stream"))
    options = f.opt_object(body, "stream_options") or {}
    include_usage = options.get("include_usage")
    if include_usage is not None:
        f.expect(include_usage, bool, "stream_options.include_usage", "a boolean")
    request = GenerationRequest.model_construct(
        messages=msgs,
        tools=tools,
        tool_choice=choice,
        temperature=f.opt_number(body, "temperature", lo=0.0, hi=2.0),
        top_p=f.opt_number(body, "top_p", lo=0.0, hi=1.0),
        max_tokens=max_tokens,
        stop=f.stop_list(body),
        seed=f.opt_int(body, "seed"),
        model=f.opt_str(body, "model"),
        rollout_id=None,
    )
    return ParsedCall(
        api="chat.completions",
        request=request,
        stream=stream,
        include_usage=stream and bool(include_usage),
        logprobs=bool(f.opt_bool(body, "logprobs")),
        return_token_ids=bool(f.opt_bool(body, "return_token_ids")),
    )


def _logprobs(gen: Generation) -> JSON | None:
    ids, lps = gen.response_token_ids, gen.response_logprobs
    if ids is None or lps is None or len(ids) != len(lps):
        return None
    # Token text is the backend's business; ids are what we know exactly, so tokens are
    # spelled the way vLLM's --return-tokens-as-token-ids spells them.
    content: list[JSON] = [
        {"token": f"token_id:{i}", "logprob": lp, "bytes": None, "top_logprobs": []}
        for i, lp in zip(ids, lps, strict=True)
    ]
    return {"content": content, "refusal": None}


def completion(call_id: str, created: int, model: str, gen: Generation, call: ParsedCall) -> JSON:
    """The ``chat.completion`` object for a finished generation."""
    message = assistant_message(gen)
    message["refusal"] = None
    choice: JSON = {
        "index": 0,
        "message": message,
        "logprobs": _logprobs(gen) if call.logprobs else None,
        "finish_reason": gen.finish_reason,
    }
    out: JSON = {
        "id": call_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": usage_of(gen),
        "system_fingerprint": None,
    }
    if call.return_token_ids:
        out["prompt_token_ids"] = gen.prompt_token_ids
        choice["token_ids"] = gen.response_token_ids
    return out


class ChatStream:
    """Writes one streamed completion's SSE chunks, in order (``stream`` writes them all
    at once from a finished turn; the gateway's live streaming writes them as the
    backend's text arrives).

    Chunks: ``start`` (the role), ``text`` per piece of content, ``end`` (each tool call:
    its index, id and name first, then its arguments in pieces; a final chunk with
    ``finish_reason``; the usage chunk, empty ``choices``, when
    ``stream_options.include_usage`` asked for it; ``data: [DONE]``).
    """

    def __init__(self, call_id: str, created: int, model: str, call: ParsedCall) -> None:
        self.call = call
        self.head: JSON = {
            "id": call_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "system_fingerprint": None,
        }
        if call.include_usage:
            self.head["usage"] = None

    def _chunk(self, delta: JSON, finish: str | None = None, top: JSON | None = None) -> bytes:
        c = {**self.head, "choices": [_choice(delta, finish)], **(top or {})}
        return b"data: " + dumps(c) + b"\n\n"

    def start(self, *, text: bool, prompt_token_ids: list[int] | None = None) -> bytes:
        """The role chunk; ``text``: the turn has content (else it opens with None)."""
        first = {"role": "assistant", "content": "" if text else None}
        ids = self.call.return_token_ids
        return self._chunk(first, top={"prompt_token_ids": prompt_token_ids} if ids else None)

    def text(self, piece: str) -> bytes:
        return self._chunk({"content": piece})

    def end(self, gen: Generation) -> bytes:
        """Everything after the text: tool calls, finish, usage, ``[DONE]``."""
        out: list[bytes] = []
        for index, tc in enumerate(gen.tool_calls):
            fn = tc["function"]
            start = {
                "index": index,
                "id": tc["id"],
                "type": "function",
                "function": {"name": fn["name"], "arguments": ""},
            }
            out.append(self._chunk({"tool_calls": [start]}))
            for piece in split(fn["arguments"]):
                delta = {"tool_calls": [{"index": index, "function": {"arguments": piece}}]}
                out.append(self._chunk(delta))
        last = _choice({}, gen.finish_reason)
        if self.call.return_token_ids:
            last["token_ids"] = gen.response_token_ids
        out.append(b"data: " + dumps({**self.head, "choices": [last]}) + b"\n\n")
        if self.call.include_usage:
            usage = {**self.head, "choices": [], "usage": usage_of(gen)}
            out.append(b"data: " + dumps(usage) + b"\n\n")
        out.append(b"data: [DONE]\n\n")
        return b"".join(out)


def stream(call_id: str, created: int, model: str, gen: Generation, call: ParsedCall) -> bytes:
    """The whole SSE body of a streamed completion from a finished turn, ``data: [DONE]``
    included, its text cut in pieces (see ``ChatStream``)."""
    w = ChatStream(call_id, created, model, call)
    out = [w.start(text=gen.text is not None, prompt_token_ids=gen.prompt_token_ids)]
    out.extend(w.text(piece) for piece in pieces(gen.text or ""))
    out.append(w.end(gen))
    return b"".join(out)


def _choice(delta: JSON, finish: str | None) -> JSON:
    return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
