"""Shared helpers of the gateway tests (core's, and the trainer's through its backends): a
served gateway, clients, running rollouts, a streamed Responses answer's text, and the
expected ``LLMCall`` of a scripted call. ``tests/`` is on pytest's ``pythonpath``."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import openai

from boltrl.gateway import Gateway
from boltrl.gateway.backend import Backend, GenerationRequest
from boltrl.records import Attempt, LLMCall, Task
from boltrl.store.base import Store
from boltrl.testing import SCRIPTED_LOGPROB, TEMPLATE_HASH, render_prompt, render_reply

JSON = dict[str, Any]


@contextmanager
def serve(backend: Backend, store: Store | None = None, **kw: Any) -> Iterator[Gateway]:
    """A started gateway on a free 127.0.0.1 port, always stopped."""
    gw = Gateway(backend, store, **kw)
    gw.start()
    try:
        yield gw
    finally:
        gw.stop()


def client(base_url: str, api_key: str = "test", *, timeout: float = 30) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=timeout)


def running(store: Store, n: int = 1) -> list[Attempt]:
    """``n`` fresh rollouts, each claimed (running) under its first attempt."""
    store.enqueue([Task(input={"i": i}) for i in range(n)])
    attempts = []
    for _ in range(n):
        a = store.claim("worker-test")
        assert a is not None
        attempts.append(a)
    return attempts


def responses_stream_deltas(events: Sequence[Any]) -> list[str]:
    """The text deltas of a streamed Responses answer, after checking its events come in the
    order the Responses API sends them (created ... completed), numbered from 0."""
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    return [e.delta for e in events if e.type == "response.output_text.delta"]


def normalized(call: LLMCall) -> JSON:
    """A recorded call with what varies run to run (timing, store order) checked and zeroed."""
    assert 0 < call.started_at <= call.ended_at
    assert call.seq > 0
    return call.model_dump() | {"started_at": 0.0, "ended_at": 0.0, "seq": 0}


def scripted_call(
    call_id: str,
    attempt: Attempt,
    request: JSON,
    *,
    text: str | None,
    tool_calls: list[JSON] | None = None,
    finish_reason: str = "stop",
    model: str = "scripted",
    policy_version: int = 0,
) -> JSON:
    """The normalized ``LLMCall`` a ScriptedBackend call must be recorded as."""
    prompt = render_prompt(
        GenerationRequest(messages=request["messages"], tools=request.get("tools"))
    ).encode()
    reply = render_reply(text, tool_calls or []).encode()
    message: JSON = {"role": "assistant", "content": text}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return LLMCall(
        id=call_id,
        rollout_id=attempt.rollout_id,
        attempt=attempt.number,
        request=request,
        response={"message": message, "finish_reason": finish_reason},
        prompt_token_ids=list(prompt),
        response_token_ids=list(reply),
        response_logprobs=[SCRIPTED_LOGPROB] * len(reply),
        policy_version=policy_version,
        template_hash=TEMPLATE_HASH,
        model=model,
        usage={
            "prompt_tokens": len(prompt),
            "completion_tokens": len(reply),
            "total_tokens": len(prompt) + len(reply),
        },
    ).model_dump()


def tool_call(call_id: str, name: str, arguments: str) -> JSON:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


WEATHER_TOOL: JSON = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
