"""Failures that explain themselves, and eval runs that are kept, through the real CLI.

Agents that raise, return a string, or return None without a reward, run by
``boltrl train`` / ``boltrl eval`` on the tiny random model: the user sees one line per
distinct error (kind, message with where it was raised, a rollout id, count), eval's
table and JSON carry the errors, an all-failed step or eval exits non-zero, and an
all-failed split scores ``n/a``. Eval records into the config's store.
"""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest
from trainer_harness import read_jsonl, run_cli, run_cli_ok, write_project

from boltrl.records import RolloutStatus, Task
from boltrl.store import open_store
from boltrl_trainer.models import tiny_model

AGENTS = textwrap.dedent(
    """
    from openai import OpenAI

    def raises(task, llm):
        raise ValueError(f"no answer for {task['id']}")

    def returns_str(task, llm):
        return "0.5"

    def returns_none(task, llm):
        return None

    def mixed(task, llm):
        if task["id"] == "v0":
            raise KeyError("prompt")
        client = OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
        client.chat.completions.create(
            model=llm.model, messages=[{"role": "user", "content": task["prompt"]}]
        )
        return 1.0
    """
)
RAISE_LINE = next(i for i, x in enumerate(AGENTS.splitlines(), 1) if "raise ValueError" in x)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("failures")
    cfg = {
        "agent": "agents.py:raises",
        "model": str(tiny_model()),
        "steps": 1,
        "batch_tasks": 3,
        "group_size": 2,
        "concurrency": 6,
        "max_tokens": 4,
        "max_attempts": 1,
        "lora": {"r": 4, "alpha": 8},
        "out_dir": "out",  # relative to this file, wherever the CLI starts
        "progress": False,
    }
    tasks = {
        "train": [{"id": f"t{i}", "prompt": f"Say {i}."} for i in range(3)],
        "val": [{"id": f"v{i}", "prompt": f"Describe {i}."} for i in range(3)],
    }
    return write_project(d, cfg, files={"agents.py": AGENTS}, tasks=tasks)


def test_train_stops_and_explains_when_every_rollout_raised(project: Path, tmp_path: Path) -> None:
    # started elsewhere: out_dir still lands beside the config
    proc = run_cli("train", str(project / "train.yaml"), cwd=tmp_path)
    assert proc.returncode == 1, (proc.stdout, proc.stderr[-3000:])
    err = proc.stderr
    assert "step 1/1: every rollout failed; nothing to train on, stopping" in err
    m = re.search(
        r"  6x exception  ValueError: no answer for t\d "
        rf"\(agents\.py:{RAISE_LINE} in raises\)  e\.g\. (ro-[0-9a-f]+)",
        err,
    )
    assert m is not None, err
    # the same summary on stdout as the step's phase ended, through the console reporter
    assert "step 1/1: failed 6/6 rollouts:" in proc.stdout
    assert "val @ 0: failed 3/3 rollouts:" in proc.stdout
    assert "val @ step 0: reward n/a over 3 tasks (all failed)" in proc.stdout
    store = open_store(f"sqlite:///{project / 'out' / 'store.db'}")
    try:
        r = store.get(m.group(1))
        assert r.status == RolloutStatus.FAILED and "no answer for" in (r.error or "")
        assert r.task.metadata["phase"] == "train"
    finally:
        store.close()
    assert not (project / "out" / "checkpoints").exists()
    assert not (tmp_path / "out").exists()


def test_train_warns_when_the_agent_returns_nothing(project: Path) -> None:
    proc = run_cli_ok(
        "train",
        "train.yaml",
        "--set",
        "agent=agents.py:returns_none",
        "--set",
        "tasks.val=null",
        "--out",
        "out-none",
        cwd=project,
    )
    assert re.search(
        r"step 1/1: warning: 6/6 rollouts returned None and emitted no reward, so they "
        r"score 0 \(return a float or call boltrl\.emit_reward\); e\.g\. ro-[0-9a-f]+",
        proc.stdout,
    ), proc.stdout
    assert "failed" not in proc.stdout.replace("failed 0", "")
    assert (project / "out-none" / "checkpoints" / "latest").is_file()


def test_eval_all_failed_is_na_exits_1_and_is_kept(project: Path) -> None:
    out = project / "eval-str"
    proc = run_cli(
        "eval",
        "train.yaml",
        "--set",
        "agent=agents.py:returns_str",
        "--set",
        f"out_dir={out}",
        "--run-name",
        "eval-str",
        cwd=project,
    )
    assert proc.returncode == 1, (proc.stdout, proc.stderr[-3000:])
    row = next(x for x in proc.stdout.splitlines() if x.startswith("val "))
    assert row.split() == ["val", "3", "n/a", "n/a", "3", "3x", "bad_return"]
    assert "agent returned str; expected a float reward or None" in proc.stdout  # task rows
    assert "boltrl eval: every rollout failed:" in proc.stderr
    assert "val: 3x bad_return  agent returned str; expected a float reward or None" in (
        proc.stderr
    )

    report = json.loads((out / "eval.json").read_text())["splits"]["val"]
    assert (report["mean"], report["std"], report["tasks"], report["failed"]) == (None, None, 3, 3)
    [group] = report["errors"]
    assert {k: group[k] for k in ("kind", "message", "count")} == {
        "kind": "bad_return",
        "message": "agent returned str; expected a float reward or None",
        "count": 3,
    }
    assert [(t["task"], t["status"], t["reward"], t["error_kind"]) for t in report["per_task"]] == [
        (f"v{i}", "failed", None, "bad_return") for i in range(3)
    ]
    store = open_store(f"sqlite:///{out / 'store.db'}")
    try:
        kept = [store.get(r.id) for r in store.query(limit=100)]
    finally:
        store.close()
    assert sorted(r.task.id for r in kept) == ["v0", "v1", "v2"]
    assert {group["rollout_id"]} <= {r.id for r in kept}
    metas = [r.task.metadata for r in kept]
    assert all(
        (m["run"], m["phase"], m["step"], m["eval"], m["evaluated"])
        == ("eval-str", "val", 0, True, str(tiny_model()))
        for m in metas
    )


def test_eval_partial_failure_shows_errors_and_exports(project: Path, tmp_path: Path) -> None:
    store_url = f"sqlite:///{tmp_path / 'kept.db'}"
    proc = run_cli(
        "eval",
        "train.yaml",
        "--set",
        "agent=agents.py:mixed",
        "--store",
        store_url,
        "--report",
        str(tmp_path / "eval.json"),
        cwd=project,
    )
    assert proc.returncode == 0, (proc.stdout, proc.stderr[-3000:])
    row = next(x for x in proc.stdout.splitlines() if x.startswith("val "))
    assert row.split() == ["val", "3", "0.667", "0.471", "1", "1x", "exception"]
    assert "eval val: failed 1/3 rollouts:" in proc.stdout
    assert re.search(r"1x exception  KeyError: 'prompt' \(agents\.py:\d+ in mixed\)", proc.stdout)
    run = json.loads((tmp_path / "eval.json").read_text())["splits"]["val"]
    assert run["mean"] == pytest.approx(2 / 3) and run["errors"][0]["kind"] == "exception"

    store = open_store(store_url)
    try:
        [name] = {store.get(r.id).task.metadata["run"] for r in store.query(limit=10)}
    finally:
        store.close()
    assert re.fullmatch(r"eval-\d{8}-\d{6}", name)
    exported = tmp_path / "t.jsonl"
    proc = run_cli_ok(
        "export",
        "--store",
        store_url,
        "--run",
        name,
        "--format",
        "jsonl",
        "--out",
        str(exported),
        cwd=project,
    )
    rows = read_jsonl(exported)
    assert sorted(r["task_id"] for r in rows) == ["v1", "v2"]


def test_eval_refuses_a_store_with_rollouts_in_flight(project: Path, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'busy.db'}"
    store = open_store(url)
    try:
        store.enqueue([Task(id="x", input={})])
    finally:
        store.close()
    proc = run_cli("eval", "train.yaml", "--store", url, cwd=project)
    assert proc.returncode == 2
    assert f"--store: {url} has 1 rollouts queued or running" in proc.stderr
    store = open_store(url)
    try:
        assert store.count() == 1  # nothing was added
    finally:
        store.close()
