"""Helpers of the adapter tests (LangChain, DSPy, AutoGen, Agents SDK): a rollout
normalized for whole-record comparison, and the records a ScriptedBackend call must
produce.

The root ``pyproject.toml`` puts ``tests/`` on pytest's ``pythonpath``, so each adapter's
tests ``import adapter_harness``; what differs between frameworks is a keyword here
(``refs``, ``api``, ``tool_choice``, ``message_only``), bound in the test module."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from boltrl.gateway.backend import GenerationRequest
from boltrl.records import Rollout
from boltrl.testing import SCRIPTED_LOGPROB, TEMPLATE_HASH, render_prompt, render_reply

JSON = dict[str, Any]

AS_CALL: Any = object()
"""Default of ``annotation``'s fields: take the value from the call."""


class Labels:
    """Stable names for ids that differ run to run: ``call-0``…, and ``run-0``… (or
    whatever ``refs`` says: the frameworks' own word for a span) for the rest."""

    def __init__(self, refs: str = "run") -> None:
        self.refs = refs
        self.names: dict[str, str] = {}
        self._counts: dict[str, int] = {}

    def new(self, value: str, kind: str) -> str:
        if value not in self.names:
            n = self._counts.get(kind, 0)
            self._counts[kind] = n + 1
            self.names[value] = f"{kind}-{n}"
        return self.names[value]

    def ref(self, value: str | None) -> str | None:
        """A reference: the label of a call id already seen, else a ``<refs>-N`` label."""
        if value is None:
            return None
        return self.names.get(value) or self.new(value, self.refs)


def _timed(rec: JSON) -> JSON:
    assert 0 < rec["started_at"] <= rec["ended_at"], rec
    return rec | {"started_at": 0.0, "ended_at": 0.0}


def normalize(ro: Rollout, *, refs: str = "run") -> JSON:
    """The rollout with its run-to-run variation (ids, times, store order) replaced by
    labels, every other field kept; ids that are not calls' are labelled ``<refs>-N``."""
    lab = Labels(refs)
    for c in ro.calls:
        lab.new(c.id, "call")
    fixed = {"rollout_id": "ro", "seq": 0}
    calls = [
        _timed(c.model_dump()) | fixed | {"id": lab.names[c.id], "parent_id": lab.ref(c.parent_id)}
        for c in ro.calls
    ]
    anns = [
        a.model_dump(exclude={"id"})
        | fixed
        | {
            "call_id": lab.ref(a.call_id),
            "span_id": lab.ref(a.span_id),
            "parent_id": lab.ref(a.parent_id),
        }
        for a in ro.annotations
    ]
    tools = [
        _timed(t.model_dump(exclude={"id"}))
        | fixed
        | {"parent_id": lab.ref(t.parent_id), "call_id": lab.ref(t.call_id)}
        for t in ro.tool_steps
    ]
    rewards = []
    for r in ro.rewards:
        assert r.timestamp > 0
        rewards.append(r.model_dump(exclude={"id"}) | fixed | {"timestamp": 0.0})
    return {
        "status": str(ro.status),
        "reward": ro.reward,
        "unjoined_calls": ro.unjoined_calls,
        "calls": calls,
        "annotations": anns,
        "tool_steps": tools,
        "rewards": rewards,
    }


def tool_call(call_id: str, name: str, arguments: str) -> JSON:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def reply(text: str | None, tool_calls: list[JSON] | None = None) -> JSON:
    """The recorded response of a scripted reply."""
    message: JSON = {"role": "assistant", "content": text}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {"message": message, "finish_reason": "tool_calls" if tool_calls else "stop"}


def call(
    label: str,
    *,
    agent: str | None,
    parent: str | None,
    messages: list[JSON],
    response: JSON,
    tools: list[JSON] | None = None,
    stream: bool = False,
    api: str = "chat.completions",
    tool_choice: str | None = None,
) -> JSON:
    """The normalized ``LLMCall`` a ScriptedBackend call is recorded (and joined) as;
    ``tool_choice`` is what the framework's client sends along with ``tools``."""
    request: JSON = {"api": api, "model": "scripted", "messages": messages}
    if tools is not None:
        request["tools"] = tools
        if tool_choice is not None:
            request["tool_choice"] = tool_choice
    if stream:
        request["stream"] = True
    prompt = render_prompt(GenerationRequest(messages=messages, tools=tools)).encode()
    msg = response["message"]
    out = render_reply(msg["content"], msg.get("tool_calls") or []).encode()
    return {
        "kind": "llm_call",
        "seq": 0,
        "id": label,
        "rollout_id": "ro",
        "attempt": 1,
        "agent": agent,
        "parent_id": parent,
        "request": request,
        "response": response,
        "prompt_token_ids": list(prompt),
        "response_token_ids": list(out),
        "response_logprobs": [SCRIPTED_LOGPROB] * len(out),
        "policy_version": 0,
        "template_hash": TEMPLATE_HASH,
        "model": "scripted",
        "usage": {
            "prompt_tokens": len(prompt),
            "completion_tokens": len(out),
            "total_tokens": len(prompt) + len(out),
        },
        "started_at": 0.0,
        "ended_at": 0.0,
        "status": "ok",
        "error": None,
        "cached": False,
        "demonstration": None,  # the policy sampled it (no teacher played the model)
    }


def annotation(
    c: JSON,
    *,
    span: str,
    index: int,
    call_id: str | None,
    framework: str,
    cached: bool = False,
    agent: str | None = None,
    parent: str | None = None,
    messages: Any = AS_CALL,
    response: Any = AS_CALL,
    message_only: bool = False,
) -> JSON:
    """The normalized annotation an adapter records for the call ``c`` (as built by
    ``call``): unless told otherwise, its request messages and its response, of which
    the framework saw the message alone with ``message_only`` (no finish reason);
    ``call_id`` None when the framework hid the response id."""
    if response is AS_CALL:
        response = {"message": c["response"]["message"]} if message_only else c["response"]
    return {
        "kind": "call_annotation",
        "seq": 0,
        "rollout_id": "ro",
        "attempt": 1,
        "call_id": call_id,
        "span_id": span,
        "parent_id": parent if parent is not None else c["parent_id"],
        "agent": agent if agent is not None else c["agent"],
        "framework": framework,
        "request_messages": c["request"]["messages"] if messages is AS_CALL else messages,
        "response": response,
        "cached": cached,
        "index": index,
    }


def tool_step(
    name: str,
    arguments: Any,
    *,
    index: int,
    result: Any = None,
    error: str | None = None,
    parent: str | None,
    call_id: str | None,
    tool_call_id: str | None,
    agent: str | None,
) -> JSON:
    return {
        "kind": "tool_step",
        "seq": 0,
        "rollout_id": "ro",
        "attempt": 1,
        "name": name,
        "arguments": arguments,
        "result": result,
        "error": error,
        "parent_id": parent,
        "call_id": call_id,
        "tool_call_id": tool_call_id,
        "agent": agent,
        "started_at": 0.0,
        "ended_at": 0.0,
        "index": index,
    }


def called_tool(
    name: str,
    arguments: Any,
    *,
    call: int,
    index: int,
    agent: str,
    result: Any = None,
    error: str | None = None,
) -> JSON:
    """The ``tool_step`` of the first tool the model asked for in ``call-<call>``, run under
    that call (its parent)."""
    return tool_step(
        name,
        arguments,
        index=index,
        result=result,
        error=error,
        parent=f"call-{call}",
        call_id=f"call-{call}",
        tool_call_id=f"call_{call}_0",
        agent=agent,
    )


def recorded(
    calls: list[JSON],
    *,
    spans: Sequence[str],
    indexes: Sequence[int],
    framework: str,
    tool_steps: list[JSON],
    rewards: Sequence[JSON] = (),
    call_ids: Sequence[str | None] | None = None,
    failed: bool = False,
    message_only: bool = False,
) -> JSON:
    """What ``normalize`` gives for a rollout of the model calls ``calls``, every one joined:
    succeeded with reward 1.0 (or ``failed`` without one). The first ``len(spans)`` calls
    are annotated by ``framework`` (a call that failed may have no annotation): the i-th in
    span ``spans[i]`` at ``indexes[i]``, with ``call_ids[i]`` (``call-i`` unless given; None
    where the framework never saw the response id), ``message_only`` as for ``annotation``."""
    ids = [f"call-{i}" for i in range(len(spans))] if call_ids is None else call_ids
    if not len(spans) == len(indexes) == len(ids) <= len(calls):
        raise ValueError(
            f"{len(spans)} spans, {len(indexes)} indexes, {len(ids)} call ids"
            f" for {len(calls)} calls"
        )
    return {
        "status": "failed" if failed else "succeeded",
        "reward": None if failed else 1.0,
        "unjoined_calls": 0,
        "calls": calls,
        "annotations": [
            annotation(
                c,
                span=span,
                index=index,
                call_id=cid,
                framework=framework,
                message_only=message_only,
            )
            for c, span, index, cid in zip(calls, spans, indexes, ids, strict=False)
        ],
        "tool_steps": tool_steps,
        "rewards": list(rewards),
    }


def reward(value: float, *, index: int, final: bool = False) -> JSON:
    return {
        "kind": "reward",
        "seq": 0,
        "rollout_id": "ro",
        "attempt": 1,
        "value": value,
        "name": "reward",
        "call_id": None,
        "index": index,
        "timestamp": 0.0,
        "final": final,
    }
