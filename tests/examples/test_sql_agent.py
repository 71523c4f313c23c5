"""examples/sql_agent: the dataset builder, the execution-match reward, the LangGraph agent
end to end on a scripted model, and ``boltrl eval`` on the tiny model."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import boltrl
from boltrl.loading import load_object
from boltrl.records import Rollout, RolloutStatus
from boltrl.testing import ScriptedBackend
from boltrl_trainer.config import load_config
from boltrl_trainer.models import tiny_model
from boltrl_trainer.tasks import load_tasks

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sql_agent"
sys.path.insert(0, str(EXAMPLE.parent))
from sql_agent import data, reward  # noqa: E402

DB = EXAMPLE / "data" / "database" / "shop" / "shop.sqlite"


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _tasks(split: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (EXAMPLE / "data" / f"{split}.jsonl").read_text().splitlines()]


# -- dataset -------------------------------------------------------------------------


def test_builder_is_deterministic_and_matches_the_shipped_data(tmp_path: Path) -> None:
    a = data.build(tmp_path / "a", seed=0)
    b = data.build(tmp_path / "b", seed=0)
    assert [p.relative_to(tmp_path / "a") for p in a] == [p.relative_to(tmp_path / "b") for p in b]
    assert [_sha(p) for p in a] == [_sha(p) for p in b]
    other = data.build(tmp_path / "c", seed=1)
    assert [_sha(p) for p in other] != [_sha(p) for p in a]
    # the committed files are what the committed script writes (the database compared by
    # content: its bytes also depend on the SQLite library's version)
    for p in a[1:]:
        assert p.read_bytes() == (EXAMPLE / "data" / p.name).read_bytes(), p.name
    dump = ["\n".join(sqlite3.connect(p).iterdump()) for p in (a[0], DB)]
    assert dump[0] == dump[1]


def test_shipped_tasks_are_graded_disjoint_and_answerable() -> None:
    splits = {s: _tasks(s) for s in ("train", "val", "test")}
    assert 300 <= sum(len(t) for t in splits.values()) <= 400
    questions = [t["question"] for ts in splits.values() for t in ts]
    assert len(questions) == len(set(questions)), "a question is in two splits"
    for split, tasks in splits.items():
        assert {t["difficulty"] for t in tasks} == set(data.LEVELS), split
        assert len({t["id"] for t in tasks}) == len(tasks)
    for t in splits["val"]:
        assert reward.execute(DB, t["query"]), t  # every gold query runs and returns rows


def test_rl_variants_leave_out_what_the_warm_start_demonstrates() -> None:
    # the RL task sets the README measures, loaded as `--set tasks.train=...` loads them:
    # none is a question the shipped warm start demonstrates (its first `limit` tasks)
    cfg = load_config(EXAMPLE / "train.yaml")
    assert cfg.warm_start is not None
    train = _tasks("train")
    shown = {t["id"] for t in train[: cfg.warm_start.limit]}
    rest = load_tasks(f"{EXAMPLE / 'data.py'}:undemonstrated_train", split="train")
    assert [t.input for t in rest] == train[cfg.warm_start.limit :]
    hard = load_tasks(f"{EXAMPLE / 'data.py'}:rl_train", split="train")
    assert [t.input for t in hard] == [
        t for t in train[cfg.warm_start.limit :] if t["difficulty"] != "easy"
    ]
    assert {t.input["difficulty"] for t in hard} == {"medium", "hard", "extra"}
    assert not shown & {t.id for t in rest}
    assert len(rest) + len(shown) == len(train)


# -- reward --------------------------------------------------------------------------

GOLD = "SELECT name FROM products WHERE category = 'Toys'"


@pytest.mark.parametrize(
    "pred",
    [
        GOLD,
        "select p.name from products p where p.category='Toys' order by p.price desc",
        "SELECT name FROM products WHERE category IN ('Toys')",
    ],
)
def test_reward_right(pred: str) -> None:
    assert reward.execution_match(pred, GOLD, DB) == 1.0


@pytest.mark.parametrize(
    "pred",
    [
        "SELECT name FROM products WHERE category = 'Books'",  # wrong rows
        "SELECT name, price FROM products WHERE category = 'Toys'",  # an extra column
        "SELECT DISTINCT category FROM products",
    ],
)
def test_reward_wrong(pred: str) -> None:
    assert reward.execution_match(pred, GOLD, DB) == 0.0


def test_reward_respects_order_only_when_the_gold_orders() -> None:
    gold = "SELECT name FROM products ORDER BY price DESC LIMIT 3"
    assert reward.execution_match(gold.replace("DESC", "ASC"), gold, DB) == 0.0
    asc = "SELECT name FROM (SELECT name, price FROM products ORDER BY price DESC LIMIT 3) "
    assert reward.execution_match(asc + "ORDER BY price ASC", gold, DB) == 0.0
    assert reward.execution_match(asc + "ORDER BY price DESC", gold, DB) == 1.0
    # floats are compared rounded: a sum computed in another order still matches
    total = "SELECT sum(price) FROM products"
    assert reward.execution_match("SELECT sum(price) FROM products ORDER BY 1", total, DB) == 1.0
    assert reward.same_result([(1.00000001,)], [(1.0,)], ordered=False)


@pytest.mark.parametrize(
    "pred",
    [
        None,
        "",
        "SELEC name FRM products",
        "SELECT nme FROM products",
        "SELECT name FROM products WHERE category = 'Toys'; SELECT 1",  # two statements
        "SELECT * FROM order_items AS a, order_items AS b",  # > MAX_ROWS rows
    ],
)
def test_reward_malformed(pred: str | None) -> None:
    assert reward.execution_match(pred, GOLD, DB) == 0.0


@pytest.mark.parametrize(
    "pred",
    [
        "DELETE FROM products",
        "UPDATE products SET category = 'Toys'",
        "INSERT INTO suppliers VALUES (99, 'X', 'Y')",
        "DROP TABLE products",
        "CREATE TEMP TABLE t AS SELECT name FROM products WHERE category = 'Toys'",
        f"ATTACH '{DB.parent / 'other.sqlite'}' AS other",
        "PRAGMA journal_mode = WAL",
    ],
)
def test_reward_refuses_sql_that_writes(pred: str) -> None:
    before = _sha(DB)
    assert reward.execution_match(pred, GOLD, DB) == 0.0
    with pytest.raises(reward.QueryError):
        reward.execute(DB, pred)
    assert _sha(DB) == before
    assert sorted(p.name for p in DB.parent.iterdir()) == ["shop.sqlite"]


def test_the_database_is_opened_read_only() -> None:
    # even without the authorizer: the connection itself cannot write
    db = sqlite3.connect(f"{DB.as_uri()}?mode=ro", uri=True)
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        db.execute("DELETE FROM products")
    db.close()


def test_reward_stops_sql_that_runs_too_long() -> None:
    forever = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT max(x) FROM c"
    with pytest.raises(reward.QueryError, match="timed out"):
        reward.execute(DB, forever, time_limit_s=0.2)
    assert reward.execution_match(forever, GOLD, DB) == 0.0  # the default 2 s limit


# -- the agent -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def example_agent() -> Any:
    return load_object(f"{EXAMPLE / 'agent.py'}:agent", what="agent")


@pytest.fixture(scope="module")
def task() -> dict[str, Any]:
    return next(t for t in _tasks("val") if t["difficulty"] == "hard")


def test_extract_sql() -> None:
    extract = load_object(f"{EXAMPLE / 'agent.py'}:extract_sql")
    assert extract("```sql\nSELECT 1;\n```") == "SELECT 1"
    assert extract("Here it is:\n```\nselect a\nfrom t\n```\nDone.") == "select a\nfrom t"
    assert extract("The answer is SELECT name FROM x; it lists names") == "SELECT name FROM x"
    assert extract("```sql\nWITH t AS (SELECT 1) SELECT * FROM t") == (
        "WITH t AS (SELECT 1) SELECT * FROM t"
    )
    assert extract("I cannot answer that.") is None


def _run(agent: Any, task: dict[str, Any], script: list[str]) -> Rollout:
    rollout = boltrl.run_rollout(agent, task, backend=ScriptedBackend(script, exhausted="raise"))
    assert rollout.status == RolloutStatus.SUCCEEDED, rollout.error
    assert rollout.unjoined_calls == 0
    assert all(c.status == "ok" and c.response_token_ids for c in rollout.calls)
    return rollout


def test_correct_trajectory_after_a_rewrite(example_agent: Any, task: dict[str, Any]) -> None:
    rollout = _run(
        example_agent,
        task,
        [
            "```sql\nSELECT sum(quantity) FROM order_items WHERE nme = 'x'\n```",
            "WRONG: there is no column nme.",
            f"```sql\n{task['query']};\n```",
            "CORRECT",
        ],
    )
    assert rollout.reward == 1.0
    assert [c.agent for c in rollout.calls] == ["writer", "checker", "writer", "checker"]
    writer1, checker1, writer2, checker2 = (c.request["messages"] for c in rollout.calls)
    assert "CREATE TABLE order_items" in writer1[1]["content"]
    assert task["question"] in writer1[1]["content"]
    assert "Error: no such column: nme" in checker1[-1]["content"]
    # the rewrite continues the writer's conversation with the checker's feedback
    assert writer2[:3] == [*writer1, {"role": "assistant", "content": writer2[2]["content"]}]
    assert "Reviewer: WRONG: there is no column nme." in writer2[3]["content"]
    assert "Result:" in checker2[-1]["content"]
    # the writer's second prompt extends its first prompt + reply, token for token
    w1, w2 = rollout.calls[0], rollout.calls[2]
    assert w2.prompt_token_ids[: len(w1.prompt_token_ids)] == w1.prompt_token_ids  # type: ignore[index]


def test_wrong_trajectories(example_agent: Any, task: dict[str, Any]) -> None:
    # a wrong query the checker approves: one round, reward 0
    wrong = "```sql\nSELECT count(*) FROM order_items\n```"
    rollout = _run(example_agent, task, [wrong, "CORRECT"])
    assert rollout.reward == 0.0
    assert [c.agent for c in rollout.calls] == ["writer", "checker"]
    # a query that never runs: the checker sends it back until three drafts were written,
    # even though the model calls it correct
    rollout = _run(example_agent, task, ["SELECT FROM WHERE", "CORRECT"] * 3)
    assert rollout.reward == 0.0
    assert [c.agent for c in rollout.calls] == ["writer", "checker"] * 3


def test_training_only_the_writer(example_agent: Any, task: dict[str, Any]) -> None:
    rollout = _run(example_agent, task, ["SELECT nme FROM t", "WRONG", task["query"], "CORRECT"])
    cfg = load_config(EXAMPLE / "train_writer.yaml")
    kept = boltrl.transitions(rollout, boltrl.CreditConfig.from_dict(cfg.credit))
    assert [t.agent for t in kept] == ["writer", "writer"]
    assert [t.reward for t in kept] == [1.0, 1.0]
    assert [t.agent for t in boltrl.transitions(rollout, "final")] == ["writer", "checker"] * 2
    assert load_config(EXAMPLE / "train.yaml").credit == {"mode": "final", "merge_prefix": True}


# -- configs -------------------------------------------------------------------------


def test_configs_validate_and_so_does_the_gpu_setting(tmp_path: Path) -> None:
    for name in ("train.yaml", "train_writer.yaml", "eval.yaml"):
        assert load_config(EXAMPLE / name).tasks.val is not None, name
    # train.yaml's commented GPU block, uncommented (what docs/gpu.md tells users to do)
    head, _, gpu = (EXAMPLE / "train.yaml").read_text().partition("\n# GPU")
    block = "\n".join(line[2:] for line in gpu.splitlines()[1:] if line.startswith("# "))
    (tmp_path / "gpu.yaml").write_text(head + "\n" + block + "\n")
    cfg = load_config(tmp_path / "gpu.yaml")
    assert (cfg.backend, cfg.model, cfg.dtype) == (
        "verl",
        "Qwen/Qwen2.5-Coder-1.5B-Instruct",
        "bfloat16",
    )
    assert cfg.verl is not None and cfg.verl.n_gpus_per_node == 1


# -- boltrl eval ---------------------------------------------------------------------


def test_boltrl_eval_on_the_tiny_model(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "boltrl.cli",
            "eval",
            str(EXAMPLE / "eval.yaml"),
            "--split",
            "val",
            "--limit",
            "2",
            "--report",
            str(tmp_path / "eval.json"),
            "--set",
            f"model={tiny_model()}",
            "--set",
            "max_tokens=8",
            "--set",
            "progress=false",
            "--set",
            f"out_dir={tmp_path}",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines()[0].split() == ["split", "tasks", "reward", "±", "std", "failed"]
    report = json.loads((tmp_path / "eval.json").read_text())
    assert report["splits"]["val"]["tasks"] == 2
    assert report["splits"]["val"]["failed"] == 0
