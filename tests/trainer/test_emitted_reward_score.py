"""An agent that only calls ``boltrl.emit_reward`` (and returns None — Agent Lightning's
convention) is scored the same in ``boltrl eval``'s table and JSON, the train/val
metrics, the progress line, the per-step line, and what training's transitions carry:
the return credit assignment trains on (``boltrl.scoring``), never 0.000."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from boltrl.credit import transitions
from boltrl.records import RolloutStatus
from boltrl.store import open_store
from boltrl_trainer.models import tiny_model

AGENT = textwrap.dedent(
    """
    import boltrl
    from openai import OpenAI

    def agent(task, llm):
        client = OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
        for _ in range(2):
            client.chat.completions.create(
                model=llm.model, messages=[{"role": "user", "content": task["prompt"]}]
            )
            boltrl.emit_reward(task["x"] / 8)  # known in advance, whatever the model says
        return None
    """
)
TRAIN = [1, 2, 3]
VAL = [0, 3]


def _expected(xs: list[int]) -> tuple[float, float]:
    scores = [2 * x / 8 for x in xs]
    return statistics.fmean(scores), statistics.pstdev(scores)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("emitted")
    (d / "agent.py").write_text(AGENT)
    for name, xs in (("train", TRAIN), ("val", VAL)):
        rows = [json.dumps({"id": f"{name}{x}", "prompt": f"Count to {x}.", "x": x}) for x in xs]
        (d / f"{name}.jsonl").write_text("\n".join(rows) + "\n")
    cfg = {
        "agent": "agent.py:agent",
        "tasks": {"train": "train.jsonl", "val": "val.jsonl"},
        "model": str(tiny_model()),
        "steps": 1,
        "batch_tasks": len(TRAIN),
        "group_size": 2,
        "concurrency": 6,
        "max_tokens": 4,
        "lora": {"r": 4, "alpha": 8},
        "out_dir": str(d / "out"),
        "progress": True,
    }
    (d / "train.yaml").write_text(yaml.safe_dump(cfg))
    return d


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "boltrl.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"},
    )


def test_training_reports_and_trains_on_the_emitted_rewards(project: Path) -> None:
    proc = _cli("train", "train.yaml", cwd=project)
    assert proc.returncode == 0, proc.stderr[-3000:]
    train_mean, train_std = _expected(TRAIN)
    val_mean, val_std = _expected(VAL)
    rows = [json.loads(x) for x in (project / "out/metrics.jsonl").read_text().splitlines()]
    step = next(r for r in rows if "train/reward_mean" in r)
    assert (step["train/reward_mean"], step["train/reward_std"]) == pytest.approx(
        (train_mean, train_std)
    )
    vals = [r for r in rows if "val/reward_mean" in r]
    assert [(r["val/reward_mean"], r["val/reward_std"]) for r in vals] == [
        pytest.approx((val_mean, val_std))
    ] * 2
    # the per-step line, the validation lines and each phase's progress line
    assert f"step   1 | reward {train_mean:.3f} ± {train_std:.3f}" in proc.stdout
    assert proc.stdout.count(f"reward {val_mean:.3f} over {len(VAL)} tasks") == 2
    assert f"step 1/1 [{'#' * 24}] 6/6" in proc.stderr
    assert f"reward {train_mean:.3f}" in proc.stderr.split("step 1/1 [")[-1].splitlines()[0]
    assert proc.stderr.count(f"val @ 0 [{'#' * 24}] 2/2") == 1
    # what training's transitions carry (final credit: the sum of the emitted rewards)
    store = open_store(f"sqlite:///{project / 'out/store.db'}")
    try:
        done = store.query(status=RolloutStatus.SUCCEEDED, limit=100)
        train = [store.get(r.id) for r in done if r.task.metadata.get("phase") == "train"]
    finally:
        store.close()
    assert len(train) == len(TRAIN) * 2
    for r in train:
        assert r.reward is None  # the agent returned nothing
        expected = 2 * r.task.input["x"] / 8
        assert [t.reward for t in transitions(r, "final")] == [expected] * 2


def test_eval_scores_the_emitted_rewards_in_its_table_and_json(project: Path) -> None:
    report = project / "eval.json"
    proc = _cli("eval", "train.yaml", "--split", "val", "--report", str(report), cwd=project)
    assert proc.returncode == 0, proc.stderr[-3000:]
    mean, std = _expected(VAL)
    lines = proc.stdout.splitlines()
    assert lines[1].split() == ["val", str(len(VAL)), f"{mean:.3f}", f"{std:.3f}", "0"]
    per_task = {ln.split()[0]: ln.split()[-1] for ln in lines[4 : 4 + len(VAL)]}
    assert per_task == {f"val{x}": f"{2 * x / 8:.3f}" for x in VAL}
    data = json.loads(report.read_text())["splits"]["val"]
    assert (data["mean"], data["std"]) == pytest.approx((mean, std))
    assert {t["task"]: t["reward"] for t in data["per_task"]} == {f"val{x}": 2 * x / 8 for x in VAL}
    assert f"reward {mean:.3f}" in proc.stderr  # the progress line
