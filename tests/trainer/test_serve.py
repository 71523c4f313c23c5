"""``boltrl serve`` on the tiny model, over real HTTP (OpenAI client, feedback route) and
a real SQLite store: config errors, what the learner trains on, the gate, promotions
reaching the next session's records, and a restart."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI

from boltrl.errors import InvalidInput
from boltrl.feedback import send_feedback
from boltrl.records import RolloutStatus
from boltrl_trainer.serve import OnlineServer
from boltrl_trainer.serve_config import ServeConfig, load_serve_config

AGENTS = Path(__file__).parent / "serve_agents.py"


def _data(out: Path, model: Path, **serve: Any) -> dict[str, Any]:
    section: dict[str, Any] = {
        "port": 0,
        "learn": {"every_sessions": 2, "max_staleness": 0},
        "gate": {"tasks": "boltrl_trainer.demo:val_tasks", "limit": 4, "tolerance": 10.0},
    }
    for key, value in serve.items():
        section[key] = {**section[key], **value} if isinstance(value, dict) else value
    return {
        "agent": "boltrl_trainer.demo:agent",
        "model": str(model),
        "max_tokens": 6,
        "concurrency": 4,
        "lora": {"r": 4, "alpha": 8},
        "optim": {"lr": 1e-3},
        "report_to": ["jsonl"],
        "out_dir": str(out),
        "serve": section,
    }


def _cfg(out: Path, model: Path, **serve: Any) -> ServeConfig:
    return load_serve_config(None, data=_data(out, model, **serve))


@pytest.fixture
def started(tmp_path: Path, tiny_model_path: Path) -> Iterator[Any]:
    servers: list[OnlineServer] = []

    def start(**serve: Any) -> OnlineServer:
        srv = OnlineServer(_cfg(tmp_path / "serve", tiny_model_path, **serve)).start(learn=False)
        servers.append(srv)
        return srv

    yield start
    for srv in servers:
        srv.stop()


def _talk(srv: OnlineServer, session: str, text: str = "What is 12 + 30?") -> str:
    client = OpenAI(base_url=srv.session_url(session), api_key="user", max_retries=0)
    reply = client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": text}]
    )
    return reply.choices[0].message.content or ""


def _versions(srv: OnlineServer, session: str) -> list[int | None]:
    return [c.policy_version for c in srv.store.get(f"session-{session}").calls]


# -- config ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"serve": None}, "serve: required"),
        ({"serve": {"port": 0}}, "serve.gate: Field required"),
        ({"serve": {"gate": {"tasks": "x.jsonl", "tolerance": -1}}}, "serve.gate.tolerance:"),
        (
            {"serve": {"gate": {"tasks": "x.jsonl"}, "learn": {"every_sessions": 0}}},
            "serve.learn.every_sessions:",
        ),
        ({"serve": {"gate": {"tasks": "x.jsonl"}, "lern": {}}}, "serve.lern: unknown field"),
        (
            {"serve": {"gate": {"tasks": "x.jsonl"}, "feedback_timeout_s": 0}},
            "serve.feedback_timeout_s:",
        ),
        ({"algorithm": "grpo"}, "algorithm: boltrl serve trains with reinforce"),
        ({"temperature": 0}, "temperature: must be > 0"),
        ({"algo": {"group_size": 3}}, "reinforce.group_size: unknown setting"),
    ],
)
def test_config_errors_name_the_field(tmp_path: Path, change: dict[str, Any], message: str) -> None:
    data = _data(tmp_path, tmp_path)
    data.update(change)
    if data["serve"] is None:
        del data["serve"]
    with pytest.raises(InvalidInput) as e:
        load_serve_config(None, data=data)
    assert message in str(e.value)


def test_config_defaults_and_relative_gate_paths(tmp_path: Path) -> None:
    (tmp_path / "serve.yaml").write_text(
        "agent: agent.py:agent\nserve:\n  gate: {tasks: held_out.jsonl, agent: gate.py:fn}\n"
    )
    cfg = load_serve_config(tmp_path / "serve.yaml", ["serve.learn.max_staleness=3"])
    assert cfg.serve.gate.tasks == str(tmp_path / "held_out.jsonl")
    assert cfg.serve.gate.agent == str(tmp_path / "gate.py:fn")
    assert cfg.serve.learn.max_staleness == 3
    assert (cfg.serve.host, cfg.serve.port) == ("127.0.0.1", 4750)
    assert cfg.algo.name == "reinforce" and cfg.algo.baseline == "running"
    assert cfg.train.agent == str(tmp_path / "agent.py:agent")


# -- the learner -------------------------------------------------------------------------


def test_learner_trains_only_rewarded_fresh_sessions(started: Any) -> None:
    srv = started()
    learner = srv.learner
    learner.score_served()
    for s in ("a", "b", "c"):  # all sampled by v0
        _talk(srv, s)
    send_feedback(srv.url, "a", 1.0)
    first = learner.round()
    assert first is not None and first.decision == "promote"  # tolerance 10: always
    assert (first.sessions, first.trained_sessions, first.transitions) == (1, 1, 1)
    assert srv.policy is not None and srv.policy.served_version == 1
    assert _versions(srv, "b") == [0]

    # b is rated now but was sampled by v0: one promotion behind, max_staleness 0
    send_feedback(srv.url, "b", 0.0, name="thumbs")
    srv.store.touch_session("c", feedback_timeout_s=0.05)  # c never rated: let it expire
    time.sleep(0.2)
    assert srv.store.expire_sessions() == 1
    _talk(srv, "d")  # the promotion reaches the next session's records
    assert _versions(srv, "d") == [1]
    send_feedback(srv.url, "d", 0.5)
    second = learner.round()
    assert second is not None
    assert (second.sessions, second.trained_sessions, second.transitions) == (2, 1, 1)
    assert (second.dropped_stale, second.expired) == (1, 1)
    expired = srv.store.get("session-c")
    assert expired.status == RolloutStatus.CANCELLED and expired.reward is None
    assert learner.round() is None  # nothing waiting: no round, nothing logged

    log = [
        json.loads(x) for x in (srv.cfg.out_dir / "promotions.jsonl").read_text().split("\n")[:-1]
    ]
    assert [d["decision"] for d in log] == ["initial", "promote", "promote"]
    assert [d["version_after"] for d in log] == [0, 1, 2]
    rows = [json.loads(x) for x in (srv.cfg.out_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["serve/trained_sessions"] for r in rows] == [1, 1]
    assert [r["offpolicy/dropped"] for r in rows] == [0, 1]
    state = json.loads((srv.cfg.out_dir / "learner.json").read_text())
    assert state["counters"]["dropped_stale"] == 1 and state["counters"]["promotions"] == 2


def test_gate_rejects_a_worse_candidate_and_keeps_serving(started: Any) -> None:
    srv = started(gate={"agent": f"{AGENTS}:answers", "tolerance": 0.0})
    learner, policy = srv.learner, srv.policy
    assert learner.score_served().mean == 1.0  # every gate call answered
    train = policy.train

    def worse(batch: Any) -> dict[str, float]:  # the update, then poison the candidate
        import torch

        out = train(batch)
        with torch.no_grad():
            for p in policy.trainer.model.parameters():
                if p.requires_grad:
                    p.fill_(math.nan)  # its logprobs are NaN: every gate call fails
        return out

    policy.train = worse  # type: ignore[method-assign]
    _talk(srv, "x")
    send_feedback(srv.url, "x", 1.0)
    d = learner.round()
    assert d is not None and d.decision == "rollback"
    assert (d.served_version, d.candidate_version, d.version_after) == (0, 1, 0)
    assert (d.candidate_score, d.served_score, d.candidate_failed) == (0.0, 1.0, 4)
    assert "discarded, v0 stays" in d.reason
    assert policy.served_version == 0 and policy.candidate_version == 0
    _talk(srv, "y")  # still served by v0, whose weights the poison never touched
    assert _versions(srv, "y") == [0]

    policy.train = train  # type: ignore[method-assign]
    send_feedback(srv.url, "y", 1.0)
    d2 = learner.round()  # reset really restored the candidate: it answers again
    assert d2 is not None and d2.decision == "promote" and d2.candidate_score == 1.0
    log = [json.loads(x) for x in (srv.cfg.out_dir / "promotions.jsonl").read_text().splitlines()]
    assert [(x["decision"], x["version_after"]) for x in log] == [
        ("initial", 0),
        ("rollback", 0),
        ("promote", 1),
    ]


def test_feedback_and_the_served_version_survive_a_restart(started: Any) -> None:
    srv = started()
    srv.learner.score_served()
    _talk(srv, "early")
    send_feedback(srv.url, "early", 1.0)
    assert srv.learner.round().decision == "promote"
    _talk(srv, "late")  # answered by v1; rated only after the restart
    srv.stop()

    again = started()
    assert again.policy.served_version == 1
    assert again.learner.state.cursor > 0  # "early" is not read twice
    send_feedback(again.url, "late", 0.25)
    again.learner.score_served()
    d = again.learner.round()
    assert d is not None and (d.sessions, d.trained_sessions, d.served_version) == (1, 1, 1)
    assert again.store.get("session-late").reward == 0.25
    _talk(again, "next")
    assert _versions(again, "next") == [2]
