"""The dashboard reports each rollout's score (``boltrl.scoring``), not only a returned
reward: an agent that only emits rewards is charted, tabled and grouped with what it
emitted, from the SQL source (its summary and its heads) and the generic one alike."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from boltrl.dashboard.model import Filters, Source
from boltrl.dashboard.source import StoreSource
from boltrl.dashboard.sqlsource import SqliteSource
from boltrl.dashboard.stats import Tracker
from boltrl.records import RewardEvent, Task
from boltrl.scoring import rollout_score
from boltrl.store import open_store
from boltrl.store.base import Store

# (emitted rewards, returned reward, outcome) per rollout, all in one group of one step
CASES: list[tuple[list[float], float | None, str]] = [
    ([0.25, 0.5], None, "succeeded"),  # emit_reward only: scores 0.75
    ([0.25], 1.0, "succeeded"),  # returned: scores 1.0 under the default credit
    ([], None, "succeeded"),  # nothing at all: scores 0.0, as training counts it
    ([0.5], None, "failed"),  # no score
]
SCORES = [0.75, 1.0, 0.0]


@pytest.fixture(params=["sqlite", "sqlite-generic", "memory"])
def filled(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Source, Store]]:
    path = tmp_path / "store.db"
    store = open_store("memory://" if request.param == "memory" else f"sqlite:///{path}")
    meta = {"run": "r", "phase": "train", "step": 1}
    store.enqueue([Task(input={"i": i}, group="g", metadata=meta) for i in range(len(CASES))])
    for emitted, returned, outcome in CASES:
        att = store.claim("w")
        assert att is not None
        store.record(att, [RewardEvent(value=v) for v in emitted])
        store.finish(att, outcome, reward=returned)
    source: Source = SqliteSource(path) if request.param == "sqlite" else StoreSource(store)
    yield source, store
    source.close()
    store.close()


def test_heads_pages_and_groups_carry_the_score(filled: tuple[Source, Store]) -> None:
    source, store = filled
    heads = source.heads_after(0, 10)
    assert [h.reward for h in heads] == [rollout_score(store.get(h.id)) for h in heads]
    assert [h.reward for h in heads] == [*SCORES, None]
    again = {h.id: h.reward for h in source.heads_of([h.id for h in heads])}
    assert again == {h.id: h.reward for h in heads}
    rows, total = source.page(Filters(), 10, 0)
    assert (total, [h.reward for h in rows]) == (4, [None, *reversed(SCORES)])
    assert sorted(source.group_rewards(heads[0])) == sorted(SCORES)


def test_the_reward_curve_averages_the_scores(filled: tuple[Source, Store]) -> None:
    source, _ = filled
    for tracker in (Tracker(source), Tracker(source, on_finished=lambda _: None)):
        tracker.refresh()  # the SQL source's first load sums in SQLite, unless told to list
        [run] = tracker.runs()["runs"]
        [step] = run["steps"]
        assert step["n"] == 3 and step["mean"] == pytest.approx(sum(SCORES) / 3)
        assert (step["min"], step["max"], step["succeeded"], step["failed"]) == (0.0, 1.0, 3, 1)
