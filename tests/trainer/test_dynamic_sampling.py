"""Dynamic sampling (``dynamic_sampling: {min_groups, max_rounds}``) on the tiny model: a
step runs more rounds of fresh tasks while too few groups have differing returns, stops
as soon as enough have, never exceeds ``max_rounds``, and the update trains at most
``batch_tasks`` informative groups, the first ones in sampling order. Also the per-step
group counts: ``train/trained_groups`` and ``train/shaping_only_groups``."""

from __future__ import annotations

import random
import textwrap
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from trainer_harness import read_jsonl, write_jsonl

from boltrl.errors import InvalidInput
from boltrl.store import open_store
from boltrl_trainer.backends import TorchBackend
from boltrl_trainer.config import TrainConfig, load_config
from boltrl_trainer.models import tiny_model
from boltrl_trainer.seams import PolicyServer, TrainBatch, TrainingBackend
from boltrl_trainer.trainer import Trainer

# "fixed" tasks earn the same reward whatever the model says (their groups teach nothing);
# "mixed" ones score the sampled text, which differs between samples at temperature 1.
# Every rollout also earns an intermediate reward (a bonus) from its text: the default
# final credit leaves it out; discounted credit adds it (the shaping-only test below)
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
        # distinct texts, distinct digests (32 bits: no accidental ties)
        digest = int(hashlib.sha256(text.encode()).hexdigest()[:8], 16) / 16**8
        boltrl.emit_reward(digest / 10, name="bonus")
        if task["kind"] == "fixed":
            return 0.5
        return digest
    """
)


class _Recorder:
    """The torch backend's trainer, keeping each batch it is given."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.batches: list[TrainBatch] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def update(self, batch: TrainBatch) -> dict[str, float]:
        self.batches.append(batch)
        return dict(self.inner.update(batch))


class _RecordingKind(TorchBackend):
    def __init__(self) -> None:
        self.recorder: _Recorder | None = None

    def build(self, cfg: TrainConfig) -> tuple[PolicyServer, TrainingBackend]:
        server, trainer = super().build(cfg)
        self.recorder = _Recorder(trainer)
        return server, self.recorder  # type: ignore[return-value]


def _config(d: Path, kinds: list[str], **extra: Any) -> TrainConfig:
    (d / "agent.py").write_text(AGENT)
    write_jsonl(
        d / "train.jsonl",
        (
            {"id": f"t{i}", "kind": k, "prompt": f"Say something about {i}."}
            for i, k in enumerate(kinds)
        ),
    )
    data = {
        "agent": f"{d / 'agent.py'}:agent",
        "tasks": {"train": str(d / "train.jsonl")},
        "model": str(tiny_model()),
        "steps": 2,
        "batch_tasks": 3,
        "group_size": 2,
        "concurrency": 6,
        "max_tokens": 4,
        "lora": {"r": 4, "alpha": 8},
        "optim": {"lr": 0.01},
        "out_dir": str(d / "out"),
        "progress": False,
        "report_to": ["jsonl"],
        **extra,
    }
    return load_config(data=data)


def _run(d: Path, kinds: list[str], **extra: Any) -> tuple[Trainer, _Recorder, Path]:
    trainer = Trainer(_config(d, kinds, **extra))
    kind = _RecordingKind()
    trainer.kind = kind
    trainer.run()
    assert kind.recorder is not None
    return trainer, kind.recorder, d / "out"


def _train_rollouts(out: Path) -> list[Any]:
    store = open_store(f"sqlite:///{out / 'store.db'}")
    try:
        return [
            r
            for r in (store.get(x.id) for x in store.query(limit=1000))
            if r.task.metadata["phase"] == "train"
        ]
    finally:
        store.close()


def _informative(ids: list[str], returns: dict[str, list[float]]) -> list[str]:
    return [t for t in ids if max(returns[t]) - min(returns[t]) > 1e-12]


def test_rounds_stop_once_enough_groups_are_informative(tmp_path: Path) -> None:
    # 9 fixed and 6 mixed tasks: a round of 3 often leaves fewer than 3 mixed groups
    kinds = ["fixed"] * 9 + ["mixed"] * 6
    random.Random(1).shuffle(kinds)
    ds = {"min_groups": 3, "max_rounds": 3}
    trainer, recorder, out = _run(tmp_path, kinds, steps=3, dynamic_sampling=ds)
    rows = [r for r in read_jsonl(out / "metrics.jsonl") if "train/rounds" in r]
    assert [r["step"] for r in rows] == [1, 2, 3]
    rollouts = _train_rollouts(out)
    tasks = trainer.train_tasks
    for row, batch in zip(rows, recorder.batches, strict=True):
        step = row["step"]
        mine = [r for r in rollouts if r.task.metadata["step"] == step]
        by_round: dict[int, list[str]] = defaultdict(list)  # task ids in sampling order
        returns: dict[str, list[float]] = defaultdict(list)
        for r in sorted(mine, key=lambda r: (r.task.metadata["round"], r.created_at)):
            ids = by_round[r.task.metadata["round"]]
            if r.task.id not in ids:
                ids.append(r.task.id)
            returns[r.task.id].append(r.reward)
        rounds = len(by_round)
        assert sorted(by_round) == list(range(1, rounds + 1)) and rounds == row["train/rounds"]
        assert row["train/sampled_rollouts"] == len(mine) == 2 * sum(map(len, by_round.values()))
        seen = [t for k in sorted(by_round) for t in by_round[k]]
        assert len(seen) == len(set(seen)), "a task ran twice in one step"
        # the first round is the draw of a run without dynamic sampling
        first = random.Random(f"0-{step}").sample(tasks, 3)
        assert set(by_round[1]) == {t.id for t in first}

        mixed = _informative(seen, returns)
        kind = {t.id: t.input["kind"] for t in tasks}
        assert mixed == [t for t in seen if kind[t] == "mixed"]
        for k in range(1, rounds):  # every earlier round left too few
            assert len(_informative([t for j in range(1, k + 1) for t in by_round[j]], returns)) < 3
        assert rounds == 3 or len(mixed) >= 3
        assert row["train/informative_groups"] == len(mixed)
        trained = list(dict.fromkeys(t.group for t in batch.transitions))
        assert trained == mixed[:3], "the update trains the first batch_tasks informative groups"
        assert row["train/trimmed_groups"] == len(mixed) - len(trained)
        assert row["train/trained_groups"] == len(trained)
    assert any(r["train/rounds"] > 1 for r in rows), "no step needed a second round"


def test_a_step_without_informative_groups_runs_max_rounds(tmp_path: Path) -> None:
    ds = {"min_groups": 1, "max_rounds": 2}
    _, recorder, out = _run(tmp_path, ["fixed"] * 7, steps=1, dynamic_sampling=ds)
    (row,) = [r for r in read_jsonl(out / "metrics.jsonl") if "train/rounds" in r]
    assert row["train/rounds"] == 2 and row["train/informative_groups"] == 0
    assert row["train/sampled_rollouts"] == 12 and row["train/skipped_groups"] == 6
    assert row["train/trained_groups"] == 0
    assert recorder.batches[0].transitions == []
    ids = {r.task.id for r in _train_rollouts(out)}
    assert len(ids) == 6  # two rounds of 3 fresh tasks (of 7)


def test_no_task_left_ends_the_rounds(tmp_path: Path) -> None:
    ds = {"min_groups": 2, "max_rounds": 5}
    _, _, out = _run(tmp_path, ["fixed"] * 4, steps=1, dynamic_sampling=ds)
    (row,) = [r for r in read_jsonl(out / "metrics.jsonl") if "train/rounds" in r]
    assert row["train/rounds"] == 2 and row["train/sampled_rollouts"] == 8  # 3 tasks, then 1


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"dynamic_sampling": {"min_groups": 4}}, r"dynamic_sampling\.min_groups: 4 is more"),
        (
            {"dynamic_sampling": {"min_groups": 2}, "algorithm": "reinforce"},
            "algorithm: grpo or rloo",
        ),
        ({"dynamic_sampling": {"min_groups": 2}, "group_size": 1}, "group_size >= 2"),
    ],
)
def test_settings_that_cannot_work_are_refused(
    tmp_path: Path, extra: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidInput, match=message):
        Trainer(_config(tmp_path, ["mixed"] * 4, **extra))


def test_max_rounds_below_two_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match=r"dynamic_sampling\.max_rounds"):
        _config(tmp_path, ["mixed"], dynamic_sampling={"min_groups": 1, "max_rounds": 1})


def _differs(values: list[float]) -> bool:
    return max(values) - min(values) > 1e-12


@pytest.mark.parametrize("mode", ["discounted", "final"])
def test_groups_set_apart_only_by_intermediate_rewards_are_counted(
    tmp_path: Path, mode: str
) -> None:
    """``train/shaping_only_groups``: the trained groups whose rollouts' final rewards are
    all equal, set apart only by their bonuses. With discounted credit the fixed tasks'
    groups train on the bonuses alone and are counted; with final credit they are skipped."""
    kinds = ["fixed", "mixed", "fixed", "fixed", "mixed", "fixed"]
    _, _, out = _run(tmp_path, kinds, credit={"mode": mode})
    rows = [r for r in read_jsonl(out / "metrics.jsonl") if "train/reward_mean" in r]
    rollouts = _train_rollouts(out)
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
