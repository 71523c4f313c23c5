"""``train/shaping_only_groups``: the groups an update learns from although their rollouts'
final rewards are all equal, i.e. only intermediate rewards (``boltrl.emit_reward``) set
them apart. Counted from the real trainer's metrics and checked against the rollouts in
its store, on the tiny model: with ``credit.mode: discounted`` the "fixed" tasks' groups
train on their bonuses alone and are counted; with ``mode: final`` they are skipped."""

from __future__ import annotations

import textwrap
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from trainer_harness import read_jsonl, write_jsonl

from boltrl.store import open_store
from boltrl_trainer.config import load_config
from boltrl_trainer.models import tiny_model
from boltrl_trainer.trainer import Trainer

# every rollout earns a bonus that depends on the sampled text (distinct texts, distinct
# bonuses); "fixed" tasks then return 0.5 whatever was said, "mixed" ones score the text
AGENT = textwrap.dedent(
    """
    import hashlib

    import boltrl
    from openai import OpenAI

    def agent(task, llm):
        client = OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
        reply = client.chat.completions.create(
            model=llm.model, messages=[{"role": "user", "content": task["prompt"]}]
        )
        text = reply.choices[0].message.content or ""
        digest = int(hashlib.sha256(text.encode()).hexdigest()[:8], 16) / 16**8
        boltrl.emit_reward(digest / 10, name="bonus")
        if task["kind"] == "fixed":
            return 0.5
        return digest
    """
)
KINDS = ["fixed", "mixed", "fixed", "fixed", "mixed", "fixed"]


def _run(d: Path, mode: str) -> tuple[list[dict[str, Any]], list[Any]]:
    (d / "agent.py").write_text(AGENT)
    write_jsonl(
        d / "train.jsonl",
        (
            {"id": f"t{i}", "kind": k, "prompt": f"Say something about {i}."}
            for i, k in enumerate(KINDS)
        ),
    )
    cfg = load_config(
        data={
            "agent": f"{d / 'agent.py'}:agent",
            "tasks": {"train": str(d / "train.jsonl")},
            "model": str(tiny_model()),
            "credit": {"mode": mode},
            "steps": 2,
            "batch_tasks": 3,
            "group_size": 2,
            "concurrency": 6,
            "max_tokens": 4,
            "temperature": 1.0,
            "lora": {"r": 4, "alpha": 8},
            "out_dir": str(d / "out"),
            "progress": False,
            "report_to": ["jsonl"],
        }
    )
    Trainer(cfg).run()
    rows = [r for r in read_jsonl(d / "out" / "metrics.jsonl") if "train/reward_mean" in r]
    store = open_store(f"sqlite:///{d / 'out' / 'store.db'}")
    try:
        rollouts = [store.get(x.id) for x in store.query(limit=1000)]
    finally:
        store.close()
    return rows, [r for r in rollouts if r.task.metadata["phase"] == "train"]


def _differs(values: list[float]) -> bool:
    return max(values) - min(values) > 1e-12


@pytest.mark.parametrize("mode", ["discounted", "final"])
def test_groups_set_apart_only_by_intermediate_rewards_are_counted(
    tmp_path: Path, mode: str
) -> None:
    rows, rollouts = _run(tmp_path, mode)
    assert len(rows) == 2
    for row in rows:
        groups: dict[str, list[Any]] = defaultdict(list)
        for r in rollouts:
            if r.task.metadata["step"] == row["step"]:
                groups[r.task.id].append(r)
        assert len(groups) == 3
        trained = shaping = 0
        for members in groups.values():
            finals = [r.reward for r in members]
            bonuses = [sum(x.value for x in r.rewards if not x.final) for r in members]
            returns = [f + b for f, b in zip(finals, bonuses, strict=True)]
            learns = _differs(finals if mode == "final" else returns)
            trained += learns
            shaping += learns and not _differs(finals)
        assert row["train/trained_groups"] == trained
        assert row["train/shaping_only_groups"] == shaping
    total = sum(r["train/shaping_only_groups"] for r in rows)
    if mode == "final":
        assert total == 0  # the final reward alone: equal finals never train
    else:  # each step draws at least one fixed task (4 of 6), whose bonuses differ
        assert total >= 2
