"""The dashboard's JSON API, on a memory and a SQLite store filled with real multi-agent
rollouts (through the gateway) and synthetic tagged runs."""

from __future__ import annotations

import math
import statistics
from typing import Any

import pytest
from conftest import Filled, Served, serve
from dashboard_fill import XSS

from boltrl import Task
from boltrl.store import open_store
from boltrl.testing import SCRIPTED_LOGPROB, render_reply

PER_STEP = {"run-a": (6, 6), "run-b": (3, 4)}
"""steps, rollouts per step of each synthetic run (see ``dashboard_fill.add_run``)."""


def expected_steps(run: str) -> list[dict[str, Any]]:
    steps, per = PER_STEP[run]
    out = []
    for phase in ("train", "val"):
        for step in range(steps):
            if phase == "val" and step % 2:
                continue
            failed = 1 if phase == "train" and step >= 1 else 0
            rewards = [
                0.1 * step + 0.05 * k + (0.2 if phase == "val" else 0.0) for k in range(failed, per)
            ]
            mean = statistics.fmean(rewards)
            row: dict[str, Any] = {"phase": phase, "step": step, "n": len(rewards)}
            row |= {"succeeded": len(rewards), "mean": mean, "std": statistics.pstdev(rewards)}
            row |= {"min": min(rewards), "max": max(rewards)}
            if failed:
                row["failed"] = 1
            out.append(row)
    return out


def test_summary_counts_every_status(served: Served, filled: Filled) -> None:
    d = served.get("/api/summary")
    assert d["counts"] == {
        "queued": 0,
        "requeued": 0,
        "running": 1,
        "succeeded": 69,
        "failed": 7,
        "cancelled": 0,
    }
    label = {"memory": "MemoryStore", "http": "http://127.0.0.1:", "sqlite": "sqlite:///"}[
        filled.kind
    ]
    assert d["store"].startswith(label)


def test_runs_have_reward_curves_throughput_and_failures(served: Served) -> None:
    d = served.get("/api/runs")
    runs = {r["name"]: r for r in d["runs"]}
    assert set(runs) == {"run-a", "run-b", None}
    for name in ("run-a", "run-b"):
        run = runs[name]
        assert run["steps"] == [pytest.approx(s) for s in expected_steps(name)]
        steps, per = PER_STEP[name]
        failed = steps - 1
        total = steps * per + ((steps + 1) // 2) * per
        assert run["counts"] == {
            "queued": 0,
            "requeued": 0,
            "running": 0,
            "succeeded": total - failed,
            "failed": failed,
            "cancelled": 0,
        }
        assert run["failures"] == {"exception": failed}
        assert sum(n for _, n in run["throughput"]) == total
        assert run["rate_recent"] == pytest.approx(total / 5)
    untagged = runs[None]
    assert untagged["counts"]["succeeded"] == 2 and untagged["counts"]["running"] == 1
    assert [s["step"] for s in untagged["steps"]] == [None]


def test_facets_list_runs_agents_and_statuses(served: Served) -> None:
    d = served.get("/api/facets")
    assert d["runs"] == ["run-a", "run-b"]
    assert d["agents"] == ["critic", "planner", "searcher", "solver"]
    assert d["statuses"] == ["queued", "requeued", "running", "succeeded", "failed", "cancelled"]


def test_rollouts_table_rows_newest_first_with_record_facts(served: Served, filled: Filled) -> None:
    d = served.get("/api/rollouts", limit=100)
    assert d["total"] == 77 and len(d["rows"]) == 77
    assert d["rows"][0]["id"] == filled.running
    assert [r["id"] for r in d["rows"][-2:]] == filled.real[::-1]
    real = d["rows"][-1]
    assert real["duration"] > 0 and real["started_at"] >= real["created_at"]
    assert real | {"duration": 0, "created_at": 0, "started_at": 0, "finished_at": 0} == {
        "id": filled.real[0],
        "status": "succeeded",
        "task_id": "math-0",
        "run": None,
        "phase": None,
        "step": None,
        "reward": 1.0,
        "attempts": 1,
        "duration": 0,
        "created_at": 0,
        "started_at": 0,
        "finished_at": 0,
        "worker": real["worker"],
        "error_kind": None,
        "agents": ["planner", "solver", "critic"],
        "policy_versions": [0],
        "calls": 4,
        "tool_steps": 1,
    }
    synth = next(r for r in d["rows"] if r["task_id"] == "run-a-train-t1" and r["step"] == 3)
    assert (synth["run"], synth["phase"], synth["agents"], synth["policy_versions"]) == (
        "run-a",
        "train",
        ["solver"],
        [3],
    )


@pytest.mark.parametrize(
    ("params", "total"),
    [
        ({"status": "failed"}, 7),
        ({"status": "running,failed"}, 8),
        ({"run": "run-b"}, 20),
        ({"run": "run-a", "status": "succeeded"}, 49),
        ({"agent": "critic"}, 2),
        ({"agent": "searcher"}, 1),
        ({"agent": "planner", "run": "run-b"}, 10),
        ({"task": "math-1"}, 1),
        ({"task": "run-a-val-t0", "status": "succeeded"}, 9),
        ({"run": "no-such-run"}, 0),
    ],
)
def test_rollouts_filters(served: Served, params: dict[str, str], total: int) -> None:
    d = served.get("/api/rollouts", limit=500, **params)
    assert d["total"] == total and len(d["rows"]) == total
    for r in d["rows"]:
        if "status" in params:
            assert r["status"] in params["status"].split(",")
        if "run" in params:
            assert r["run"] == params["run"]
        if "agent" in params:
            assert params["agent"] in r["agents"]
        if "task" in params:
            assert r["task_id"] == params["task"]


def test_rollouts_pagination_covers_everything_once(served: Served) -> None:
    seen: list[str] = []
    for offset in range(0, 77, 20):
        d = served.get("/api/rollouts", limit=20, offset=offset)
        assert (d["total"], d["offset"], d["limit"]) == (77, offset, 20)
        seen += [r["id"] for r in d["rows"]]
    everything = [r["id"] for r in served.get("/api/rollouts", limit=100)["rows"]]
    assert seen == everything and len(set(seen)) == 77


def _strip(node: dict[str, Any]) -> Any:
    return (node["kind"], node["id"], node["agent"], [_strip(c) for c in node["children"]])


def test_detail_tree_follows_the_call_tree(served: Served, filled: Filled) -> None:
    rid = filled.real[0]
    rollout = filled.store.get(rid)
    plan, ask, answer, critique = (c.id for c in rollout.calls)
    [tool] = rollout.tool_steps
    [reward] = rollout.rewards
    d = served.get(f"/api/rollouts/{rid}")
    assert [_strip(n) for n in d["tree"]] == [
        (
            "attempt",
            "attempt:1",
            None,
            [
                ("span", "span:1:turn-planner", "planner", [("call", plan, "planner", [])]),
                (
                    "span",
                    "span:1:turn-solver",
                    "solver",
                    [
                        (
                            "call",
                            ask,
                            "solver",
                            [("tool", tool.id, "solver", []), ("reward", reward.id, None, [])],
                        ),
                        ("call", answer, "solver", []),
                    ],
                ),
                ("span", "span:1:turn-critic", "critic", [("call", critique, "critic", [])]),
            ],
        )
    ]
    assert d["tree"][0]["outcome"] == "succeeded"
    solver = d["tree"][0]["children"][1]
    call = solver["children"][0]
    assert call["call"]["response"]["tool_calls"][0]["function"]["name"] == "calculator"
    assert call["call"]["tools"] == ["calculator"]
    assert call["call"]["messages"] == [
        {"role": "system", "content": "You solve."},
        {"role": "user", "content": "What is 2+2? (#0)"},
    ]
    assert call["transition"] == {
        "step": 1,
        "reward": 1.0,
        "done": False,
        "merged_calls": 1,
        "action_tokens": call["call"]["response_tokens"],
    }
    assert call["children"][0]["tool"] == {
        "name": "calculator",
        "arguments": {"expr": "2+2"},
        "result": {"value": 4},
        "error": None,
        "call_id": ask,
        "tool_call_id": "call_1_0",
    }
    assert call["children"][1]["reward"] == {
        "value": 0.25,
        "name": "tool_ok",
        "final": False,
        "call_id": ask,
    }
    assert solver["children"][1]["call"]["response"]["content"] == f"The answer is 4. {XSS}"
    assert (d["reward"], d["status"], d["counts"]) == (
        1.0,
        "succeeded",
        {"calls": 4, "tool_steps": 1, "rewards": 1},
    )
    assert d["credit"] == {"mode": "final", "gamma": 1.0, "error": None}


def test_detail_credit_modes(served: Served, filled: Filled) -> None:
    rid = filled.real[1]

    def credited(**params: Any) -> list[float]:
        d = served.get(f"/api/rollouts/{rid}", **params)
        calls = [n for n in _walk(d["tree"]) if n["kind"] == "call"]
        return [n["transition"]["reward"] for n in sorted(calls, key=lambda n: n["seq"])]

    assert credited() == [1.0] * 4
    assert credited(credit="discounted") == [1.25, 1.25, 1.0, 1.0]
    # step rewards [0, 0.25 (tool_ok on the solver's call), 0, 1.0 (final)]
    assert credited(credit="discounted", gamma=0.5) == pytest.approx([0.25, 0.5, 0.5, 1.0])


def _walk(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for n in nodes:
        out += [n, *_walk(n["children"])]
    return out


def test_detail_advantage_estimate_from_the_task_group(served: Served) -> None:
    rows = served.get("/api/rollouts", task="run-a-train-t0", limit=100)["rows"]
    row = next(r for r in rows if r["step"] == 1 and r["reward"] == pytest.approx(0.2))
    d = served.get(f"/api/rollouts/{row['id']}")
    group = [0.2, 0.3]  # k=2 and k=4 of step 1; k=0 failed
    std = statistics.stdev(group)
    assert d["advantage_group"] == pytest.approx({"group_size": 2, "mean": 0.25, "std": std})
    [call] = [n for n in _walk(d["tree"]) if n["kind"] == "call"]
    assert call["advantage"]["value"] == pytest.approx((0.2 - 0.25) / (std + 1e-6))


def test_detail_of_a_failed_rollout_shows_the_traceback(served: Served) -> None:
    [row] = served.get("/api/rollouts", status="failed", run="run-b", limit=1)["rows"]
    d = served.get(f"/api/rollouts/{row['id']}")
    assert d["status"] == "failed" and "ValueError: <b>bad</b>" in d["error"]
    [att] = d["attempts"]
    assert (att["outcome"], att["error_kind"]) == ("failed", "exception")
    assert att["error"].startswith("Traceback (most recent call last):")


def test_tokens_of_a_scripted_call_decode_as_bytes(served: Served, filled: Filled) -> None:
    rollout = filled.store.get(filled.real[0])
    call = rollout.calls[2]
    d = served.get(f"/api/rollouts/{rollout.id}/calls/{call.id}/tokens")
    text = render_reply(f"The answer is 4. {XSS}")
    assert d["ids"] == list(text.encode())
    assert d["logprobs"] == [SCRIPTED_LOGPROB] * len(d["ids"])
    assert "".join(d["pieces"]) == text and d["decoded_by"] == "scripted-bytes"
    assert d["prompt_tokens"] == len(call.prompt_token_ids or [])


def test_tokens_without_a_decoder_are_ids(served: Served, filled: Filled) -> None:
    rows = served.get("/api/rollouts", run="run-b", limit=1)["rows"]
    rollout = filled.store.get(rows[0]["id"])
    call = rollout.calls[0]
    d = served.get(f"/api/rollouts/{rollout.id}/calls/{call.id}/tokens")
    assert (d["ids"], d["logprobs"], d["pieces"], d["decoded_by"]) == (
        [5, 6, 7],
        [-0.1, -1.5, -3.0],
        None,
        "none",
    )


def test_workers_from_attempts_and_the_store(served: Served, filled: Filled) -> None:
    d = served.get("/api/workers")
    by = {w["worker_id"]: w for w in d["workers"]}
    assert by["w-tools"]["state"] == "busy" and by["w-tools"]["running"] == [filled.running]
    synth = by["w-synth"]
    assert (synth["state"], synth["running"], synth["attempts"]) == ("idle", [], 54)
    assert (synth["finished_recent"], synth["failed_recent"]) == (54, 5)
    assert synth["rate"] == pytest.approx(54 / 5)
    assert by["w-synth-b"]["attempts"] == 20
    assert d["workers"][0]["worker_id"] == "w-tools"  # busy first
    assert len(by) == 5  # two run_rollout runners too
    assert all(math.isfinite(w["last_seen"]) and w["last_seen"] > 0 for w in d["workers"])


@pytest.mark.parametrize(
    ("path", "status", "code"),
    [
        ("/api/rollouts/ro-nope", 404, "not_found"),
        ("/api/rollouts/ro-nope/calls/x/tokens", 404, "not_found"),
        ("/api/rollouts?status=done", 400, "invalid_input"),
        ("/api/rollouts?limit=0", 400, "invalid_input"),
        ("/api/rollouts?limit=abc", 400, "invalid_input"),
        ("/api/rollouts?offset=-1", 400, "invalid_input"),
        ("/api/rollouts?offset=99999999999999999999999", 400, "invalid_input"),
        ("/api/rollouts?limit=99999999999999999999999", 400, "invalid_input"),
        ("/api/rollouts/ro-nope?gamma=nan", 400, "invalid_input"),
        ("/api/rollouts/ro-nope?gamma=1e999", 400, "invalid_input"),
    ],
)
def test_bad_requests_get_clear_errors(served: Served, path: str, status: int, code: str) -> None:
    resp = served.http.get(path)
    assert resp.status_code == status
    assert resp.json()["error"]["code"] == code


def test_bad_credit_names_the_field(served: Served, filled: Filled) -> None:
    resp = served.http.get(f"/api/rollouts/{filled.real[0]}", params={"credit": "best"})
    assert resp.status_code == 400
    assert resp.json()["error"]["message"].startswith("credit.mode:")


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_split_stands_in_for_an_untagged_phase(kind: str, tmp_path: Any) -> None:
    store = open_store("memory://" if kind == "memory" else f"sqlite:///{tmp_path}/s.db")
    try:
        store.enqueue([Task(id="s", input={}, split="val", metadata={"run": "r", "step": 4})])
        att = store.claim("w")
        assert att is not None
        store.finish(att, "succeeded", reward=0.5)
        with serve(store) as srv:
            [run] = srv.get("/api/runs")["runs"]
            assert [(s["phase"], s["step"], s["mean"]) for s in run["steps"]] == [("val", 4, 0.5)]
            [row] = srv.get("/api/rollouts")["rows"]
            assert row["phase"] == "val"
    finally:
        store.close()
