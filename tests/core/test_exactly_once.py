"""Exactly-once over HTTP (issue 15 item 5): enqueue keys survive a restart of a
SQLite-backed store server, a key is bound to its route and body, a retried finish that
committed answers success, and a long-poll claim whose client went away spends nothing.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import httpx
import pytest

from boltrl.records import Attempt, RolloutStatus, Task
from boltrl.store import HttpStore, MemoryStore, SqliteStore
from boltrl.store.server import serve_in_thread

pytestmark = pytest.mark.timeout(60)

TASKS = {"tasks": [{"id": "t1", "input": {"q": 1}}]}


def _post(url: str, path: str, body: object, key: str) -> httpx.Response:
    return httpx.post(f"{url}/store{path}", json=body, headers={"Idempotency-Key": key})


def test_an_enqueue_key_survives_a_restart_of_a_sqlite_backed_server(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    answers = []
    for _ in range(2):  # the same retry, before and after a restart
        store = SqliteStore(path)
        with serve_in_thread(store) as server:
            r = _post(server.url, "/rollouts", TASKS, "enqueue-1")
            assert r.status_code == 200, r.text
            answers.append(r.json()["ids"])
            other = _post(server.url, "/rollouts", {"tasks": [{"input": {"q": 2}}]}, "enqueue-1")
            assert other.status_code == 400, other.text
            assert (
                "'enqueue-1' was first used for another request" in other.json()["error"]["message"]
            )
            count = store.count()
        store.close()
    assert answers[0] == answers[1] and count == 1


def test_a_key_answers_its_own_route_only() -> None:
    backing = MemoryStore()
    with serve_in_thread(backing) as server:
        ids = _post(server.url, "/rollouts", TASKS, "k").json()["ids"]
        claim = _post(server.url, "/claim", {"worker_id": "w", "lease_s": 5.0}, "k")
        assert claim.status_code == 200, claim.text
        att = Attempt.model_validate(claim.json())
        assert (att.rollout_id, att.number) == (ids[0], 1)
        res = _post(server.url, "/resources", {"model": "m"}, "k2")
        again = _post(server.url, "/resources", {"model": "other"}, "k2")
        assert res.status_code == 200 and again.status_code == 400, again.text
    backing.close()


def test_a_retried_finish_that_committed_answers_success_after_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = SqliteStore(path)
    with serve_in_thread(store) as server, HttpStore(server.url) as client:
        [rid] = client.enqueue([Task(input={})])
        att = client.claim("w")
        assert att is not None
        body = {"attempt": json.loads(att.model_dump_json()), "status": "succeeded", "reward": 1.0}
        first = _post(server.url, "/finish", body, "finish-1")
        assert first.status_code == 200, first.text
    store.close()
    store = SqliteStore(path)  # the server's memory of the key is gone
    with serve_in_thread(store) as server:
        again = _post(server.url, "/finish", body, "finish-1")
        assert again.status_code == 200, again.text
        assert again.json()["status"] == "succeeded" and again.json()["reward"] == 1.0
        assert [a.outcome for a in store.get(rid).attempts] == ["succeeded"]
    store.close()


def test_a_claim_whose_client_disconnected_puts_the_rollout_back_unspent(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="boltrl.store.server")
    backing = MemoryStore()
    with serve_in_thread(backing) as server:
        with pytest.raises(httpx.ReadTimeout):  # the runner gives up waiting and leaves
            httpx.post(
                f"{server.url}/store/claim",
                json={"worker_id": "gone", "lease_s": 30.0, "wait_s": 3.0},
                timeout=0.5,
            )
        [rid] = backing.enqueue([Task(input={})])  # the abandoned long-poll takes it
        time.sleep(3.0)  # past the long-poll's own end
        assert f"claim of {rid} undone: its client disconnected" in caplog.text
        r = backing.get(rid)
        assert r.status is RolloutStatus.QUEUED and r.attempts == []
        with HttpStore(server.url) as client:
            att = client.claim("w", wait_s=1.0)
        assert att is not None and (att.rollout_id, att.number) == (rid, 1)
    backing.close()
