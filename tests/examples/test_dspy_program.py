"""examples/dspy_program: the dataset builder and file reader, the task metric, the DSPy
program end to end on a scripted model, and ``boltrl eval`` on the tiny model."""

from __future__ import annotations

import hashlib
import json
import os
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

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "dspy_program"
sys.path.insert(0, str(EXAMPLE.parent))
from dspy_program import data, reward  # noqa: E402


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _tasks(split: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (EXAMPLE / "data" / f"{split}.jsonl").read_text().splitlines()]


# -- dataset -------------------------------------------------------------------------


def test_builder_is_deterministic_and_matches_the_shipped_data(tmp_path: Path) -> None:
    a = data.build(tmp_path / "a", seed=0)
    b = data.build(tmp_path / "b", seed=0)
    assert [_sha(p) for p in a] == [_sha(p) for p in b]
    assert [_sha(p) for p in data.build(tmp_path / "c", seed=1)] != [_sha(p) for p in a]
    for p in a:
        assert p.read_bytes() == (EXAMPLE / "data" / p.name).read_bytes(), p.name


def test_shipped_problems_are_graded_disjoint_and_right() -> None:
    splits = {s: _tasks(s) for s in ("train", "val", "test")}
    assert [len(splits[s]) for s in ("train", "val", "test")] == [240, 80, 80]
    questions = [t["question"] for ts in splits.values() for t in ts]
    assert len(questions) == len(set(questions)), "a question is in two splits"
    for tasks in splits.values():
        assert {t["level"] for t in tasks} == set(data.LEVELS)
        assert all(len(t["answer"]) <= 9 and t["metric"] == "numeric" for t in tasks)
    by_question = {t["question"]: t["answer"] for ts in splits.values() for t in ts}
    assert by_question["A bucket holds 4 liters. How many milliliters is that?"] == "4000"
    assert by_question["A film lasts 285 seconds. How many minutes is that?"] == "4.75"
    assert (
        by_question[
            "Farah pours 12 glasses of 200 milliliters each. How many liters is that in total?"
        ]
        == "2.4"
    )


def test_teacher_spells_out_every_shipped_training_problem() -> None:
    """The warm start's plans show each multiplication or division and end in the gold
    answer, on every level (a plan that only states the answer teaches the student to
    state a number without the arithmetic)."""
    from dspy_program.teacher import plan_for

    for t in _tasks("train"):
        plan = plan_for(t)
        steps = plan.splitlines()
        assert len(steps) >= 2 and "Work out" not in plan, (t["question"], plan)
        assert f"= {t['answer']} " in steps[-1], (t["question"], plan)
        assert any(op in plan for op in (" * ", " / ")), plan


def test_rl_train_is_the_shipped_problems_but_two_step() -> None:
    rl = data.rl_train()
    shipped = _tasks("train")
    assert rl == [t for t in shipped if t["level"] != "two-step"]
    assert {t["level"] for t in rl} == {"one-step", "decimal", "word"} and len(rl) == 180


def test_reads_a_question_answer_file(tmp_path: Path) -> None:
    src = tmp_path / "gsm8k.jsonl"
    rows = [
        {"question": f"Q{i}?", "answer": f"Step one.\nStep two.\n#### {i * 1000}"}
        for i in range(10)
    ]
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    files = data.from_file(src, tmp_path / "out", sizes=(0.6, 0.2))
    tasks = {p.stem: [json.loads(x) for x in p.read_text().splitlines()] for p in files}
    assert [len(tasks[s]) for s in ("train", "val", "test")] == [6, 2, 2]
    got = sorted((t["question"], t["answer"]) for ts in tasks.values() for t in ts)
    assert got == sorted((f"Q{i}?", str(i * 1000)) for i in range(10))
    assert all(t["metric"] == "numeric" for ts in tasks.values() for t in ts)
    again = data.from_file(src, tmp_path / "again", sizes=(0.6, 0.2))
    assert [_sha(p) for p in again] == [_sha(p) for p in files]
    # a JSON list with other field names, scored by exact match
    src = tmp_path / "qa.json"
    src.write_text(json.dumps([{"q": "Capital of France?", "a": "Paris"}]))
    [train, _, _] = data.from_file(
        src, tmp_path / "qa", metric="exact", question_field="q", answer_field="a", sizes=(1, 0)
    )
    assert [json.loads(x) for x in train.read_text().splitlines()] == [
        {"id": "qa-00000", "question": "Capital of France?", "answer": "Paris", "metric": "exact"}
    ]


# -- metric --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "gold", "expected"),
    [
        ("300", "300", 1.0),  # right
        ("300.0", "300", 1.0),
        ("1,500 milliliters", "1500", 1.0),
        ("The answer is 2.25 hours.", "2.25", 1.0),
        ("2.3333", "2.333333333", 1.0),
        ("30", "300", 0.0),  # wrong
        ("3000", "300", 0.0),
        ("-300", "300", 0.0),
        ("2.2", "2.25", 0.0),
        (None, "300", 0.0),  # malformed
        ("", "300", 0.0),
        ("three hundred", "300", 0.0),
        ("[[ ## answer ## ]]", "300", 0.0),
    ],
)
def test_numeric_metric(answer: str | None, gold: str, expected: float) -> None:
    assert reward.score({"answer": gold, "metric": "numeric"}, answer) == expected


def test_exact_metric_and_dspy_signature() -> None:
    assert reward.score({"answer": "Paris", "metric": "exact"}, " paris\n") == 1.0
    assert reward.score({"answer": "Paris", "metric": "exact"}, "Paris, France") == 0.0
    assert reward.score({"answer": "Paris", "metric": "exact"}, None) == 0.0
    import dspy

    example = dspy.Example(question="q", answer="4.75")
    assert reward.metric(example, dspy.Prediction(answer="4.75 minutes")) == 1.0
    assert reward.metric(example, dspy.Prediction(answer="4.5")) == 0.0


# -- the program ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def example_agent() -> Any:
    return load_object(f"{EXAMPLE / 'agent.py'}:agent", what="agent")


@pytest.fixture(scope="module")
def task() -> dict[str, Any]:
    return next(t for t in _tasks("val") if t["level"] == "word")


def fields(**values: str) -> str:
    """A reply in DSPy's ChatAdapter format."""
    return "".join(f"[[ ## {k} ## ]]\n{v}\n\n" for k, v in values.items()) + "[[ ## completed ## ]]"


def _run(agent: Any, task: dict[str, Any], script: list[str]) -> Rollout:
    rollout = boltrl.run_rollout(agent, task, backend=ScriptedBackend(script, exhausted="raise"))
    assert rollout.status == RolloutStatus.SUCCEEDED, rollout.error
    assert rollout.unjoined_calls == 0
    assert all(c.status == "ok" and c.response_token_ids and not c.cached for c in rollout.calls)
    return rollout


PLAN = "1. Multiply the amounts.\n2. Convert to the asked unit."


def test_correct_trajectory(example_agent: Any, task: dict[str, Any]) -> None:
    rollout = _run(example_agent, task, [fields(plan=PLAN), fields(answer=task["answer"])])
    assert rollout.reward == 1.0
    assert [c.agent for c in rollout.calls] == ["plan", "answer"]
    plan_msgs, answer_msgs = (c.request["messages"] for c in rollout.calls)
    assert task["question"] in plan_msgs[-1]["content"]
    assert "[[ ## plan ## ]]" in plan_msgs[0]["content"]
    assert PLAN in answer_msgs[-1]["content"], "the answer predictor sees the plan"
    # the same program, twice in a row: every call reaches the model (cache=False)
    again = _run(example_agent, task, [fields(plan=PLAN), fields(answer=task["answer"])])
    assert [c.agent for c in again.calls] == ["plan", "answer"]


def test_plain_text_replies_are_read_too(example_agent: Any, task: dict[str, Any]) -> None:
    # small models drop DSPy's field markers: the whole reply is the only output field
    rollout = _run(example_agent, task, ["Multiply, then divide.", f"It is {task['answer']}."])
    assert rollout.reward == 1.0
    assert [c.agent for c in rollout.calls] == ["plan", "answer"]
    assert "Multiply, then divide." in rollout.calls[1].request["messages"][-1]["content"]


def test_wrong_trajectories(example_agent: Any, task: dict[str, Any]) -> None:
    wrong = str(float(task["answer"]) * 10)
    for script in (
        [fields(plan=PLAN), fields(answer=wrong)],  # a wrong number
        ["Multiply.", f"The answer is {wrong} liters."],  # the same, without markers
        [fields(plan=PLAN), "I do not know."],  # no number at all
    ):
        rollout = _run(example_agent, task, script)
        assert rollout.reward == 0.0, script
        assert [c.agent for c in rollout.calls] == ["plan", "answer"]


# -- configs -------------------------------------------------------------------------


def test_configs_validate_and_so_does_the_gpu_setting(tmp_path: Path) -> None:
    for name in ("train.yaml", "eval.yaml"):
        assert load_config(EXAMPLE / name).tasks.val is not None, name
    # train.yaml's commented GPU block, uncommented (what docs/gpu.md tells users to do)
    head, _, gpu = (EXAMPLE / "train.yaml").read_text().partition("\n# GPU")
    block = "\n".join(line[2:] for line in gpu.splitlines()[1:] if line.startswith("# "))
    (tmp_path / "gpu.yaml").write_text(head + "\n" + block + "\n")
    cfg = load_config(tmp_path / "gpu.yaml")
    assert (cfg.backend, cfg.model, cfg.dtype) == ("verl", "Qwen/Qwen2.5-1.5B-Instruct", "bfloat16")
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
