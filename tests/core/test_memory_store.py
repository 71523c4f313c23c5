"""The memory store keeps records as shallow copies that share their set of explicitly
set fields; they must behave exactly like ``model_copy`` copies."""

from __future__ import annotations

from boltrl.records import LLMCall, RewardEvent, Task
from boltrl.store import MemoryStore


def test_stored_records_behave_like_model_copies() -> None:
    store = MemoryStore()
    store.enqueue([Task(input={}), Task(input={})])
    first, second = store.claim("w"), store.claim("w")
    assert first is not None and second is not None
    call = LLMCall(id="c1", rollout_id=first.rollout_id, attempt=1, prompt_token_ids=[5, 6])
    reward = RewardEvent(id="r1", value=0.5)
    store.record(first, [call, reward])
    store.record(second, [call.model_copy(update={"rollout_id": second.rollout_id})])
    a, b = store.get(first.rollout_id), store.get(second.rollout_id)
    (stored,) = a.calls
    assert stored == call.model_copy(update={"seq": stored.seq})
    assert stored.model_dump_json() == call.model_copy(update={"seq": stored.seq}).model_dump_json()
    assert stored.model_fields_set == call.model_fields_set | {"seq"}
    assert a.rewards[0] == reward.model_copy(
        update={"seq": a.rewards[0].seq, "rollout_id": first.rollout_id, "attempt": 1}
    )
    # changing a copy of one stored record leaves the others (sharing its field set) alone
    changed = stored.model_copy(update={"agent": "solver"})
    assert "agent" in changed.model_fields_set
    assert "agent" not in stored.model_fields_set
    assert "agent" not in b.calls[0].model_fields_set
    assert b.calls[0].agent is None
