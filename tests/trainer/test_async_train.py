"""Async ``boltrl train`` (``async: {max_staleness: 1}``) on the tiny model: rollouts of the
next step run during the update; no sample is trained twice, every trained sample is
within the bound, the versions are on the records, and drops are counted."""

from __future__ import annotations

import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from trainer_harness import read_jsonl

from boltrl.errors import InvalidInput
from boltrl.records import RolloutStatus
from boltrl.store import open_store
from boltrl_trainer.backends import TorchBackend
from boltrl_trainer.config import TrainConfig, load_config
from boltrl_trainer.models import tiny_model
from boltrl_trainer.seams import PolicyServer, TrainBatch, TrainingBackend
from boltrl_trainer.trainer import Trainer

TWO_CALL_AGENT = textwrap.dedent(
    """
    from openai import OpenAI

    def agent(task, llm):
        client = OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
        messages = [{"role": "user", "content": task["prompt"]}]
        first = client.chat.completions.create(model=llm.model, messages=messages)
        a = first.choices[0].message.content or ""
        messages += [{"role": "assistant", "content": a}, {"role": "user", "content": "More."}]
        second = client.chat.completions.create(model=llm.model, messages=messages)
        text = a + (second.choices[0].message.content or "")
        return sum(c in "aeiou" for c in text) / max(len(text), 1)
    """
)


class _Recording:
    """The torch backend's trainer, recording each batch and the version it met."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.batches: list[tuple[int, TrainBatch]] = []

    @property
    def policy_version(self) -> int:
        return int(self.inner.policy_version)

    @property
    def served_version(self) -> int:
        return int(self.inner.served_version)

    def update(self, batch: TrainBatch) -> dict[str, float]:
        self.batches.append((self.inner.policy_version, batch))
        return dict(self.inner.update(batch))

    def use_separate_copy(self, *, resettable: bool = False) -> None:
        self.inner.use_separate_copy(resettable=resettable)

    def promote(self) -> int:
        return int(self.inner.promote())

    def reset(self) -> None:
        self.inner.reset()

    def save(self, path: Path) -> None:
        self.inner.save(path)

    def load(self, path: Path, *, policy_version: int) -> None:
        self.inner.load(path, policy_version=policy_version)

    def close(self) -> None:
        self.inner.close()


class _RecordingKind(TorchBackend):
    def __init__(self) -> None:
        self.trainer: _Recording | None = None

    def build(self, cfg: TrainConfig) -> tuple[PolicyServer, TrainingBackend]:
        server, trainer = super().build(cfg)
        self.trainer = _Recording(trainer)
        return server, self.trainer


def _config(d: Path, **extra: Any) -> TrainConfig:
    (d / "agent.py").write_text(TWO_CALL_AGENT)
    (d / "train.jsonl").write_text(
        "".join(f'{{"id": "t{i}", "prompt": "Say something about {i}."}}\n' for i in range(6))
    )
    (d / "val.jsonl").write_text(
        "".join(f'{{"id": "v{i}", "prompt": "Describe {i}."}}\n' for i in range(2))
    )
    data = {
        "agent": f"{d / 'agent.py'}:agent",
        "tasks": {"train": str(d / "train.jsonl"), "val": str(d / "val.jsonl")},
        "model": str(tiny_model()),
        "steps": 4,
        "batch_tasks": 2,
        "group_size": 3,
        "concurrency": 6,
        "max_tokens": 6,
        "lora": {"r": 4, "alpha": 8},
        "optim": {"lr": 0.01},
        "val_every": 2,
        "out_dir": str(d / "out"),
        "progress": False,
        "report_to": ["jsonl"],
        **extra,
    }
    return load_config(data=data)


@pytest.fixture(scope="module")
def async_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Trainer, _RecordingKind, Path]:
    d = tmp_path_factory.mktemp("async")
    cfg = _config(d, **{"async": {"max_staleness": 1}})
    trainer = Trainer(cfg)
    kind = _RecordingKind()
    trainer.kind = kind
    trainer.run()
    return trainer, kind, d / "out"


def test_async_trains_each_sample_once_within_the_bound(async_run: Any) -> None:
    _, kind, out = async_run
    assert kind.trainer is not None
    batches = kind.trainer.batches
    assert [v for v, _ in batches] == [0, 1, 2, 3]  # one update per step, in order
    store = open_store(f"sqlite:///{out / 'store.db'}")
    try:
        rollouts = [store.get(r.id) for r in store.query(limit=1000)]
    finally:
        store.close()
    step_of = {
        r.id: r.task.metadata["step"] for r in rollouts if r.task.metadata["phase"] == "train"
    }
    seen_calls: set[str] = set()
    staleness: Counter[int] = Counter()
    for version, batch in batches:
        for t in batch.transitions:
            assert step_of[t.rollout_id] == version + 1  # step j's rollouts, trained by update j
            assert not seen_calls & set(t.call_ids), "a sample was trained twice"
            seen_calls |= set(t.call_ids)
            assert t.policy_version is not None
            staleness[version - t.policy_version] += 1
    assert set(staleness) <= {0, 1}
    assert staleness[1] > 0, "no rollout ran during an update: nothing overlapped"

    for r in rollouts:
        versions = {c.policy_version for c in r.calls}
        step = r.task.metadata["step"]
        if r.task.metadata["phase"] == "val":  # validation of step s sees version s only
            assert versions == {step}, (r.id, versions)
        else:  # launched once version step-2 was served, finished before update `step`
            assert r.status == RolloutStatus.SUCCEEDED and len(r.calls) == 2
            assert versions <= {step - 2, step - 1} and None not in versions, (step, versions)

    rows = read_jsonl(out / "metrics.jsonl")
    steps = [r for r in rows if "update/loss" in r]
    assert [r["policy_version"] for r in steps] == [1, 2, 3, 4]
    assert [r["step"] for r in rows if "val/reward_mean" in r] == [0, 2, 4]
    for row in steps:  # the histogram is that of the calls the store holds for the step
        calls = [
            c
            for r in rollouts
            if r.task.metadata["phase"] == "train" and r.task.metadata["step"] == row["step"]
            for c in r.calls
        ]
        hist = Counter(row["step"] - 1 - c.policy_version for c in calls)
        got = {
            int(k.rsplit("_", 1)[1]): v
            for k, v in row.items()
            if k.startswith("offpolicy/staleness_") and k[-1].isdigit()
        }
        assert got == hist and row["offpolicy/dropped"] == 0
        assert row["time/update_s"] > 0 and "time/overlap_s" in row and "time/swap_s" in row
    assert any(r.get("offpolicy/stale_frac", 0) > 0 for r in steps)
    assert any("offpolicy/is_weight_mean" in r for r in steps)


def test_stale_samples_beyond_the_bound_are_dropped_and_counted(async_run: Any) -> None:
    trainer, _, out = async_run
    store = open_store(f"sqlite:///{out / 'store.db'}")
    try:
        step1 = [
            store.get(r.id)
            for r in store.query(limit=1000)
            if r.task.metadata == {**r.task.metadata, "phase": "train", "step": 1}
        ]
    finally:
        store.close()
    assert len(step1) == 6  # version-0 samples; at version 3 with bound 1 they are too old
    batch, stats = trainer._batch(step1, 3, 1.0, 1)
    assert batch.transitions == [] and stats["train/transitions"] == 0
    assert stats["offpolicy/dropped"] == 12 and stats["offpolicy/staleness_3"] == 12
    batch, stats = trainer._batch(step1, 1, 1.0, 1)  # one version old: kept
    assert stats["offpolicy/dropped"] == 0 and stats["train/transitions"] == 12


def test_async_config_is_validated(tmp_path: Path) -> None:
    for bad in ({"max_staleness": 0}, {}, {"max_staleness": 1, "lookahead": 2}, 3):
        with pytest.raises(InvalidInput, match=r"async"):
            _config(tmp_path, **{"async": bad})
    assert _config(tmp_path, **{"async": None}).async_ is None
    cfg = load_config(data={"agent": "a:b"}, overrides=["async.max_staleness=2"])
    assert cfg.async_ is not None and cfg.async_.max_staleness == 2
    assert cfg.model_dump(mode="json")["async"] == {"max_staleness": 2}  # round-trips
    assert TrainConfig.model_validate(cfg.model_dump(mode="json")).async_ == cfg.async_


def test_async_runs_on_when_updates_are_skipped(tmp_path: Path) -> None:
    # equal rewards in every group: each update is skipped and the version stays 0; the
    # rollouts still launch by steps served, so the run does not wait for a version
    (tmp_path / "const.py").write_text(
        textwrap.dedent(
            """
            from openai import OpenAI

            def agent(task, llm):
                client = OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
                client.chat.completions.create(
                    model=llm.model, messages=[{"role": "user", "content": task["prompt"]}]
                )
                return 1.0
            """
        )
    )
    cfg = _config(tmp_path, **{"async": {"max_staleness": 1}, "steps": 3, "val_every": 0})
    cfg = cfg.model_copy(update={"agent": f"{tmp_path / 'const.py'}:agent"})
    result = Trainer(cfg).run()
    rows = read_jsonl(tmp_path / "out" / "metrics.jsonl")
    steps = [r for r in rows if "update/skipped" in r]
    assert result.steps_done == 3 and [r["step"] for r in steps] == [1, 2, 3]
    assert [r["policy_version"] for r in steps] == [0, 0, 0]
