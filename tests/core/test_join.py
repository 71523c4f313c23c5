"""join_records: tool steps whose parent is a model call's framework span get its call id."""

from __future__ import annotations

from boltrl.join import join_records
from boltrl.records import CallAnnotation, LLMCall, ToolStep


def test_tool_step_parent_span_becomes_the_joined_call_id() -> None:
    msgs = [{"role": "user", "content": "hi"}]
    call = LLMCall(id="chatcmpl-1", rollout_id="ro-1", attempt=1, request={"messages": msgs})
    ann = CallAnnotation(
        rollout_id="ro-1",
        attempt=1,
        span_id="run-a",
        parent_id="node-1",
        agent="planner",
        request_messages=msgs,
    )
    asked = ToolStep(rollout_id="ro-1", attempt=1, name="add", parent_id="run-a")
    other = ToolStep(rollout_id="ro-1", attempt=1, name="x", parent_id="node-1", call_id=None)
    known = ToolStep(rollout_id="ro-1", attempt=1, name="y", parent_id="run-a", call_id="c-0")

    calls, steps, unjoined = join_records([call], [ann], [asked, other, known])

    assert unjoined == 0
    assert [(c.id, c.agent, c.parent_id) for c in calls] == [("chatcmpl-1", "planner", "node-1")]
    assert steps == [
        asked.model_copy(update={"parent_id": "chatcmpl-1", "call_id": "chatcmpl-1"}),
        other,
        known.model_copy(update={"parent_id": "chatcmpl-1"}),
    ]
