"""A retried finish (same ``Idempotency-Key``) is answered again, not acted on again: the
server remembers how to answer it (the rollout as it now stands), not the answer's
bytes."""

from __future__ import annotations

import httpx

from boltrl.records import LLMCall, Rollout, Task
from boltrl.store import HttpStore, MemoryStore
from boltrl.store.server import serve_in_thread


def test_retried_finish_answers_the_rollout_again() -> None:
    backing = MemoryStore()
    with serve_in_thread(backing) as server, HttpStore(server.url) as client:
        [rid] = client.enqueue([Task(input={"q": 1})])
        attempt = client.claim("w")
        assert attempt is not None
        client.record(attempt, [LLMCall(id="c", rollout_id=rid, attempt=1)])
        url = f"{server.url}/store/finish"
        body = {"attempt": attempt.model_dump(mode="json"), "status": "succeeded", "reward": 1.0}
        headers = {"Idempotency-Key": "finish-1"}
        first = httpx.post(url, json=body, headers=headers)
        again = httpx.post(url, json=body, headers=headers)
        assert first.status_code == again.status_code == 200
        assert Rollout.model_validate_json(again.content) == backing.get(rid)
        assert first.json() == again.json()
        assert [a.outcome for a in backing.get(rid).attempts] == ["succeeded"]
        # a refused finish (another key, another outcome) is remembered as it was
        stale = {"Idempotency-Key": "finish-2"}
        other = {**body, "status": "failed"}
        refused = httpx.post(url, json=other, headers=stale)
        assert refused.status_code == 409
        assert httpx.post(url, json=other, headers=stale).json() == refused.json()
    backing.close()
