"""An agent that only calls ``boltrl.emit_reward`` (and returns None — Agent Lightning's
convention) is scored the same in ``boltrl eval``'s table and JSON, the train/val
metrics, the progress line, the per-step line, and what training's transitions carry:
the return credit assignment trains on (``boltrl.scoring``), never 0.000."""

from __future__ import annotations

import json
import statistics
import textwrap
from pathlib import Path

import pytest
from trainer_harness import read_jsonl, run_cli_ok, write_project

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
    cfg = {
        "agent": "agent.py:agent",
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
    tasks = {
        name: [{"id": f"{name}{x}", "prompt": f"Count to {x}.", "x": x} for x in xs]
        for name, xs in (("train", TRAIN), ("val", VAL))
    }
    return write_project(d, cfg, files={"agent.py": AGENT}, tasks=tasks)


def test_training_reports_and_trains_on_the_emitted_rewards(project: Path) -> None:
    proc = run_cli_ok("train", "train.yaml", cwd=project)
    train_mean, train_std = _expected(TRAIN)
    val_mean, val_std = _expected(VAL)
    rows = read_jsonl(project / "out/metrics.jsonl")
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
    proc = run_cli_ok("eval", "train.yaml", "--split", "val", "--report", str(report), cwd=project)
    mean, std = _expected(VAL)
    lines = proc.stdout.splitlines()
    assert lines[1].split() == ["val", str(len(VAL)), f"{mean:.3f}", f"{std:.3f}", "0"]
    per_task = {ln.split()[0]: ln.split()[-1] for ln in lines[4 : 4 + len(VAL)]}
    assert per_task == {f"val{x}": f"{2 * x / 8:.3f}" for x in VAL}
    data = json.loads(report.read_text())["splits"]["val"]
    assert (data["mean"], data["std"]) == pytest.approx((mean, std))
    assert {t["task"]: t["reward"] for t in data["per_task"]} == {f"val{x}": 2 * x / 8 for x in VAL}
    assert f"reward {mean:.3f}" in proc.stderr  # the progress line


def test_warm_start_rejection_scores_the_emitted_rewards(project: Path) -> None:
    """Expert iteration over an emit_reward-only agent's training rollouts: ``min_reward``
    compares the same score (2 x / 8), not a missing final reward read as 0."""
    from transformers import AutoTokenizer

    from boltrl.loading import load_object
    from boltrl_trainer.config import load_config
    from boltrl_trainer.demonstrations import collect

    if not (project / "out/store.db").exists():
        run_cli_ok("train", "train.yaml", cwd=project)
    cfg = load_config(
        project / "train.yaml",
        [
            f"warm_start.teacher.store=sqlite:///{project / 'out/store.db'}",
            "warm_start.min_reward=0.5",
        ],
    )
    assert cfg.warm_start is not None
    demos = collect(
        cfg,
        cfg.warm_start,
        agent=load_object(str(project / "agent.py") + ":agent", what="agent"),
        tokenizer=AutoTokenizer.from_pretrained(str(tiny_model())),
        store=open_store("memory://"),
    )
    # train tasks x = 1, 2, 3 score 0.25, 0.5, 0.75; two rollouts each; val never read
    assert (demos.rollouts, demos.kept, demos.rejected) == (6, 4, 2)
    assert sorted(demos.rewards) == [0.5, 0.5, 0.75, 0.75]
