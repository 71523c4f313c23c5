"""Join adapter annotations onto the gateway's calls, and assemble a rollout from its records.

The gateway knows the tokens; adapters know the structure (agent, parent). They meet
on an explicit key: the response id the gateway issued, which most frameworks pass
through. When a framework hides it, an annotation is matched by order and content
within its attempt: the next unmatched gateway call whose request messages agree with
the annotation's. Never by timestamp. What cannot be joined is counted, not dropped.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from boltrl.records import AnyRecord, CallAnnotation, LLMCall, RewardEvent, Rollout, ToolStep


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        parts = []
        for p in content:
            if isinstance(p, dict):
                parts.append(str(p.get("text", p.get("content", ""))))
            else:
                parts.append(str(p))
        return "\n".join(parts)  # as the gateway (and vLLM) join text parts
    return str(content)


def message_signature(messages: Sequence[dict[str, Any]] | None) -> tuple[tuple[str, str], ...]:
    """(role, text) pairs, whitespace-trimmed: what two views of one request agree on
    even when frameworks format tool calls or content parts differently."""
    if not messages:
        return ()
    out = []
    for m in messages:
        role = str(m.get("role", ""))
        if role == "developer":
            role = "system"
        out.append((role, _text(m.get("content")).strip()))
    return tuple(out)


def _content_agrees(ann: CallAnnotation, call: LLMCall) -> bool:
    if ann.request_messages is None:
        return True
    a = message_signature(ann.request_messages)
    c = message_signature(call.request.get("messages"))
    if a == c:
        return True
    # Some frameworks keep the system prompt out of what they report (e.g. the Agents
    # SDK's Responses model): accept when the annotation is the call minus system turns.
    strip = tuple(x for x in c if x[0] != "system")
    return a == strip or tuple(x for x in a if x[0] != "system") == strip


def join_calls(
    calls: Sequence[LLMCall], annotations: Sequence[CallAnnotation]
) -> tuple[list[LLMCall], int]:
    """Return the calls with ``agent``/``parent_id`` (and ``cached``) filled from their
    annotations, and the number of annotations that matched no call.

    ``calls`` must be in write order (``seq``), ``annotations`` in index order. An
    annotation marked ``cached`` never reached the gateway and is not counted unjoined.
    Parent ids that name another annotation's framework span are translated to that
    annotation's call id, so the tree is expressed in call ids where possible.
    """
    joined, unjoined, _ = _join(calls, annotations)
    return joined, unjoined


def join_records(
    calls: Sequence[LLMCall],
    annotations: Sequence[CallAnnotation],
    tool_steps: Sequence[ToolStep],
) -> tuple[list[LLMCall], list[ToolStep], int]:
    """``join_calls``, plus the tool steps with their parent translated the same way.

    A tool step whose ``parent_id`` is the framework span of a joined annotation (the
    model call that asked for the tool, when the adapter could not see its response id,
    e.g. a streamed call) gets that call's id as ``parent_id``, and as ``call_id`` when
    it has none. Other tool steps are returned unchanged.
    """
    joined, unjoined, span_to_call = _join(calls, annotations)
    steps = []
    for t in tool_steps:
        cid = span_to_call.get(t.parent_id) if t.parent_id is not None else None
        if cid is None:
            steps.append(t)
        else:
            steps.append(t.model_copy(update={"parent_id": cid, "call_id": t.call_id or cid}))
    return joined, steps, unjoined


def _join(
    calls: Sequence[LLMCall], annotations: Sequence[CallAnnotation]
) -> tuple[list[LLMCall], int, dict[str, str]]:
    by_id = {c.id: c for c in calls}
    matched: dict[str, CallAnnotation] = {}
    unjoined = 0
    pending: list[CallAnnotation] = []
    for ann in annotations:
        if ann.cached:
            continue
        if ann.call_id is not None:
            if ann.call_id in by_id and ann.call_id not in matched:
                matched[ann.call_id] = ann
            elif ann.call_id not in matched:
                unjoined += 1
            continue
        pending.append(ann)

    # Order-and-content join, per attempt.
    for ann in pending:
        found = None
        for c in calls:
            if c.attempt != ann.attempt or c.id in matched:
                continue
            if _content_agrees(ann, c):
                found = c
                break
        if found is None:
            unjoined += 1
        else:
            matched[found.id] = ann

    span_to_call = {a.span_id: cid for cid, a in matched.items() if a.span_id}
    out = []
    for c in calls:
        m = matched.get(c.id)
        if m is None:
            out.append(c)
            continue
        parent = m.parent_id
        if parent is not None:
            parent = span_to_call.get(parent, parent)
        out.append(
            c.model_copy(
                update={
                    "agent": m.agent if m.agent is not None else c.agent,
                    "parent_id": parent if parent is not None else c.parent_id,
                }
            )
        )
    return out, unjoined, span_to_call


def assemble(head: Rollout, records: Iterable[AnyRecord]) -> Rollout:
    """The rollout with its records split by kind (seq order kept) and calls joined."""
    calls: list[LLMCall] = []
    tools: list[ToolStep] = []
    rewards: list[RewardEvent] = []
    anns: list[CallAnnotation] = []
    for r in records:
        if isinstance(r, LLMCall):
            calls.append(r)
        elif isinstance(r, ToolStep):
            tools.append(r)
        elif isinstance(r, RewardEvent):
            rewards.append(r)
        else:
            anns.append(r)
    joined, tools, unjoined = join_records(
        calls, sorted(anns, key=lambda a: (a.attempt, a.index, a.seq)), tools
    )
    return head.model_copy(
        update={
            "calls": joined,
            "tool_steps": tools,
            "rewards": rewards,
            "annotations": anns,
            "unjoined_calls": unjoined,
        }
    )
