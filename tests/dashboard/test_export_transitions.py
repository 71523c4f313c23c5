"""``boltrl export --format jsonl|parquet``: transitions of finished rollouts, exactly as
``boltrl.credit.transitions`` makes them."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dashboard_fill import add_run, run_real, synthetic_call

from boltrl import Task, Transition
from boltrl.cli import main
from boltrl.credit import CreditConfig, transitions
from boltrl.export import MissingExtra, write_transitions
from boltrl.records import Rollout
from boltrl.store import open_store


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, list[Rollout]]]:
    """Two real rollouts, run "r" (with failures), and one rollout without token ids."""
    path = tmp_path_factory.mktemp("tr") / "store.db"
    store = open_store(f"sqlite:///{path}")
    try:
        run_real(store, 2)
        add_run(store, "r", 2, 2)
        [rid] = store.enqueue([Task(id="no-ids", input={})])
        att = store.claim("w")
        assert att is not None
        bare = synthetic_call(rid, 0, 0).model_copy(update={"prompt_token_ids": None})
        store.record(att, [bare])
        store.finish(att, "succeeded", reward=1.0)
        everything = store.query(limit=100)
        rollouts = [store.get(r.id) for r in everything]
    finally:
        store.close()
    return path, rollouts


def expected(rollouts: list[Rollout], credit: CreditConfig, status: str = "succeeded") -> list[Any]:
    out = []
    for r in rollouts:
        if r.status.value == status and r.task.id != "no-ids":
            out += [t.model_dump() for t in transitions(r, credit)]
    return out


def test_jsonl_holds_every_transition_of_succeeded_rollouts(
    db: Any, tmp_path: Path, capsys: Any
) -> None:
    path, rollouts = db
    out = tmp_path / "t.jsonl"
    assert (
        main(["export", "--store", f"sqlite:///{path}", "--format", "jsonl", "--out", str(out)])
        == 0
    )
    rows = [
        Transition.model_validate_json(line).model_dump() for line in out.read_text().splitlines()
    ]
    assert rows == expected(rollouts, CreditConfig())
    assert len(rows) == 2 * 4 + 5  # two real rollouts of 4 calls, five succeeded synthetic ones
    said = capsys.readouterr().out
    assert (
        "13 transitions of 7 rollouts" in said and "(1 rollouts without token ids skipped)" in said
    )


def test_parquet_with_discounted_credit_and_filters(db: Any, tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    path, rollouts = db
    out = tmp_path / "t.parquet"
    args = ["export", "--store", f"sqlite:///{path}", "--format", "parquet", "--out", str(out)]
    assert main([*args, "--credit", "discounted", "--gamma", "0.5"]) == 0
    rows = pq.read_table(out).to_pylist()
    want = expected(rollouts, CreditConfig(mode="discounted", gamma=0.5))
    assert rows == want
    assert main([*args, "--run", "r", "--status", "failed"]) == 0
    failed = [r for r in rollouts if r.task.metadata.get("run") == "r"]
    assert pq.read_table(out).to_pylist() == expected(failed, CreditConfig(), "failed")
    assert main([*args, "--agents", "solver"]) == 0
    agents = {row["agent"] for row in pq.read_table(out).to_pylist()}
    assert agents == {"solver"}


def test_write_transitions_refuses_an_unknown_format(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="format: expected jsonl or parquet"):
        write_transitions([], tmp_path / "x", format="csv")  # type: ignore[arg-type]


def test_parquet_without_pyarrow_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with pytest.raises(MissingExtra, match=r"pip install 'boltrl\[parquet\]'"):
        write_transitions([], tmp_path / "x.parquet", format="parquet")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--format", "jsonl"], "--format needs --out FILE"),
        (["--format", "jsonl", "--out", "x", "--status", "running"], "not a finished status"),
        (["--otlp", "http://h", "--header", "novalue"], "expected KEY=VALUE"),
    ],
)
def test_cli_refuses_bad_arguments(argv: list[str], message: str, capsys: Any) -> None:
    assert main(["export", "--store", "memory://", *argv]) == 2
    assert message in capsys.readouterr().err
