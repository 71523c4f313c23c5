"""The dashboard's SQL finds rows through the store's indexes.

SQLite uses an index on an expression only when the query writes the same expression,
and says nothing when it does not (it scans instead). So each filtered query the
dashboard really issues is captured from its connection and its plan asked for the index.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from dashboard_fill import add_run, add_tool_only

from boltrl.dashboard.model import Filters
from boltrl.dashboard.sqlsource import SqliteSource
from boltrl.store import open_store


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("idx") / "store.db"
    store = open_store(f"sqlite:///{path}")
    add_run(store, "run-a", 2, 4)
    add_run(store, "run-b", 1, 2)
    add_tool_only(store)
    store.close()
    yield path


def _plans(db: Path, use: Callable[[SqliteSource], object]) -> list[tuple[str, str]]:
    """(statement, its query plan) for every statement ``use`` makes the source run."""
    src = SqliteSource(db)
    seen: list[str] = []
    src._db.set_trace_callback(seen.append)  # the statements as run, values bound
    use(src)
    src._db.set_trace_callback(None)
    con = sqlite3.connect(db)
    try:
        plans = []
        for sql in seen:
            rows = con.execute(f"EXPLAIN QUERY PLAN {sql}").fetchall()
            plans.append((sql, "\n".join(r[-1] for r in rows)))
        return plans
    finally:
        con.close()


@pytest.mark.parametrize(
    ("use", "index", "table"),
    [
        (lambda s: s.page(Filters(run="run-a"), 10, 0), "rollouts_by_run", "rollouts"),
        (lambda s: s.page(Filters(task="run-a-train-t0"), 10, 0), "rollouts_by_task", "rollouts"),
        (lambda s: s.page(Filters(agent="solver"), 10, 0), "records_by_agent", "records"),
        (lambda s: s.agents(), "records_by_agent", "records"),
    ],
    ids=["run", "task", "agent", "agent-names"],
)
def test_filtered_queries_use_the_store_index(
    db: Path, use: Callable[[SqliteSource], object], index: str, table: str
) -> None:
    plans = _plans(db, use)
    assert plans, "the source ran no statement"
    for sql, plan in plans:
        assert f"USING INDEX {index}" in plan or f"USING COVERING INDEX {index}" in plan, (
            sql,
            plan,
        )
        assert f"SCAN {table}\n" not in plan + "\n", (sql, plan)  # no full scan beside it


def test_group_rewards_of_an_ungrouped_task_use_the_task_index(db: Path) -> None:
    src = SqliteSource(db)
    [head] = [h for h in src.page(Filters(run="run-a"), 1, 0)[0]]
    assert head.group is None  # the task id is the group

    plans = _plans(db, lambda s: s.group_rewards(head))
    assert [("rollouts_by_task" in plan) for _, plan in plans] == [True], plans


def test_the_filters_still_find_the_rows(db: Path) -> None:
    # The index is used for the right rows, not a plan over the wrong expression.
    src = SqliteSource(db)
    assert src.page(Filters(run="run-b"), 100, 0)[1] == 4
    assert src.page(Filters(task="run-a-train-t0"), 100, 0)[1] == 4
    assert src.page(Filters(agent="searcher"), 100, 0)[1] == 1
    assert src.agents() == ["planner", "searcher", "solver"]
