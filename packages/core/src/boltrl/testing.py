"""Deterministic stand-ins for testing agents, adapters and runners without a model.

``ScriptedBackend`` answers from a script. Its token ids are a documented function of
text — UTF-8 bytes — so tests can assert exact token truth:

- the prompt is rendered by ``render_prompt``: an optional ``<|tools|>{json}\\n`` line,
  then each message as ``<|role|>`` + content + its tool calls + ``\\n``, then
  ``<|assistant|>``;
- a reply is rendered by ``render_reply``: its text followed by each tool call as
  ``<tool_call>{"name": NAME, "arguments": ARGUMENTS}</tool_call>`` (ARGUMENTS is the
  JSON string verbatim), exactly as an assistant message is rendered in a prompt, so a
  conversation's next prompt extends the previous prompt + reply;
- ``prompt_token_ids`` / ``response_token_ids`` are the UTF-8 bytes of those strings
  (ids 0-255) and every response logprob is ``SCRIPTED_LOGPROB``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
from collections.abc import Callable, Sequence
from typing import Any, Literal, TypeAlias

from boltrl._common import JSON
from boltrl.errors import BackendError
from boltrl.gateway.backend import Generation, GenerationRequest

__all__ = [
    "SCRIPTED_LOGPROB",
    "TEMPLATE_HASH",
    "Reply",
    "ScriptedBackend",
    "render_prompt",
    "render_reply",
]

Reply: TypeAlias = "str | JSON | BaseException | Callable[[GenerationRequest], str | JSON]"
"""A script item: assistant text; ``{"content"?: str, "tool_calls": [{"name", "arguments",
"id"?}]}``; an exception to raise (a backend failure); or a function of the request
returning either of the first two."""

SCRIPTED_LOGPROB = -0.5
"""The logprob recorded for every scripted response token."""

TEMPLATE_ID = "boltrl-scripted-template-v1"
TEMPLATE_HASH = hashlib.sha256(TEMPLATE_ID.encode()).hexdigest()[:16]
"""The ``template_hash`` scripted generations carry."""


def _render_call(name: str, arguments: str) -> str:
    return f'<tool_call>{{"name": {json.dumps(name)}, "arguments": {arguments}}}</tool_call>'


def render_reply(text: str | None, tool_calls: Sequence[JSON] = ()) -> str:
    """An assistant turn as the scripted model "writes" it (see the module docstring)."""
    out = text or ""
    for tc in tool_calls:
        fn = tc["function"]
        out += _render_call(fn["name"], fn["arguments"])
    return out


def render_prompt(request: GenerationRequest) -> str:
    """The prompt string whose UTF-8 bytes are the scripted ``prompt_token_ids``."""
    parts = []
    if request.tools:
        parts.append(f"<|tools|>{json.dumps(request.tools, sort_keys=True)}\n")
    for m in request.messages:
        body = render_reply(m.get("content"), m.get("tool_calls") or ())
        parts.append(f"<|{m['role']}|>{body}\n")
    parts.append("<|assistant|>")
    return "".join(parts)


def _check(item: Any, index: int) -> None:
    if isinstance(item, str | BaseException) or callable(item):
        return
    if not isinstance(item, dict):
        raise TypeError(f"replies[{index}] must be a str, a dict, an exception or a callable")
    unknown = set(item) - {"content", "tool_calls"}
    if unknown:
        raise ValueError(f"replies[{index}] has unknown keys {sorted(unknown)}")
    for j, tc in enumerate(item.get("tool_calls") or ()):
        if not isinstance(tc, dict) or not isinstance(tc.get("name"), str):
            raise ValueError(f"replies[{index}].tool_calls[{j}] needs a string 'name'")


class ScriptedBackend:
    """A ``Backend`` that serves ``replies`` in order, from the start for each rollout.

    Each rollout (by ``GenerationRequest.rollout_id``) has its own position in the script;
    calls without a rollout share one more. When the script runs out, ``exhausted``
    decides: ``"repeat"`` (default) serves the last reply again, ``"raise"`` fails the
    call with ``BackendError``. ``replies`` may also be one callable, used for every call.

    Text replies honor ``stop`` (cut before the first stop string) and ``max_tokens``
    (cut to that many bytes, ``finish_reason="length"``). Tool-call ids are
    ``call_{n}_{i}`` (n: the reply's position in the rollout, i: the call's index)
    unless the script gives an ``id``. ``with_token_ids=False`` imitates a server that
    cannot report token ids (they and the logprobs come back None). ``delay_s`` waits
    that long per call, to imitate a model's latency. Thread-safe.
    """

    def __init__(
        self,
        replies: Sequence[Reply] | Callable[[GenerationRequest], str | JSON],
        *,
        model: str = "scripted",
        exhausted: Literal["repeat", "raise"] = "repeat",
        with_token_ids: bool = True,
        delay_s: float = 0.0,
        policy_version: int = 0,
    ) -> None:
        script: list[Any] = [replies] if callable(replies) else list(replies)
        if not script:
            raise ValueError("replies must not be empty")
        for i, item in enumerate(script):
            _check(item, i)
        if exhausted not in ("repeat", "raise"):
            raise ValueError(f"exhausted must be 'repeat' or 'raise', got {exhausted!r}")
        self._script = script
        self._model = model
        self._exhausted = exhausted
        self._with_ids = with_token_ids
        self._delay_s = delay_s
        self.policy_version = policy_version
        self._positions: dict[str | None, int] = {}
        self._lock = threading.Lock()
        self.calls = 0
        """How many calls were served (failures included)."""

    @property
    def model_name(self) -> str:
        return self._model

    def reset(self) -> None:
        """Start every rollout's script from the beginning again."""
        with self._lock:
            self._positions.clear()

    def _next(self, rollout_id: str | None) -> tuple[int, Any]:
        with self._lock:
            n = self._positions.get(rollout_id, 0)
            self._positions[rollout_id] = n + 1
            self.calls += 1
        if n >= len(self._script) and self._exhausted == "raise":
            raise BackendError(f"the script has no reply #{n + 1} (it has {len(self._script)})")
        return n, self._script[min(n, len(self._script) - 1)]

    async def generate(self, request: GenerationRequest) -> Generation:
        """The next scripted reply for the request's rollout."""
        if self._delay_s:
            await asyncio.sleep(self._delay_s)
        n, item = self._next(request.rollout_id)
        if isinstance(item, BaseException):
            raise item
        if callable(item):
            item = item(request)
            _check(item, n)
        text, calls = (item, []) if isinstance(item, str) else _parts(item, n)
        finish = "tool_calls" if calls else "stop"
        if not calls and text is not None:
            text, finish = _truncate(text, request)
        prompt = render_prompt(request).encode()
        reply = render_reply(text, calls).encode()
        if finish == "length" and request.max_tokens is not None:
            reply = reply[: request.max_tokens]
        ids = self._with_ids
        return Generation(
            text=text,
            tool_calls=calls,
            finish_reason=finish,
            prompt_token_ids=list(prompt) if ids else None,
            response_token_ids=list(reply) if ids else None,
            response_logprobs=[SCRIPTED_LOGPROB] * len(reply) if ids else None,
            policy_version=self.policy_version,
            template_hash=TEMPLATE_HASH,
            model=self._model,
            usage={
                "prompt_tokens": len(prompt),
                "completion_tokens": len(reply),
                "total_tokens": len(prompt) + len(reply),
            },
        )

    async def aclose(self) -> None:
        """Nothing to release."""


def _parts(item: JSON, n: int) -> tuple[str | None, list[JSON]]:
    calls = []
    for i, tc in enumerate(item.get("tool_calls") or ()):
        args = tc.get("arguments", {})
        calls.append(
            {
                "id": tc.get("id") or f"call_{n}_{i}",
                "type": "function",
                "function": {
                    "name": tc["name"],
                    "arguments": args if isinstance(args, str) else json.dumps(args),
                },
            }
        )
    return item.get("content"), calls


def _truncate(text: str, request: GenerationRequest) -> tuple[str, str]:
    cut = min((i for i in (text.find(s) for s in request.stop if s) if i >= 0), default=-1)
    if cut >= 0:
        text = text[:cut]
    limit = request.max_tokens
    if limit is not None and len(text.encode()) > limit:
        return text.encode()[:limit].decode(errors="ignore"), "length"
    return text, "stop"
