"""examples/calc_agent: the dataset builder, the GSM8K reader, the reward, the calculator,
scripted end-to-end rollouts through the real AutoGen agent, and ``boltrl eval`` on the
tiny model."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import boltrl
from boltrl.loading import load_object
from boltrl.records import RolloutStatus
from boltrl.testing import ScriptedBackend

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "calc_agent"
_SIBLINGS = ("data", "reward")


class Example:
    def __init__(self, agent: Any, data: ModuleType, reward: ModuleType, mod: ModuleType):
        self.agent, self.data, self.reward, self.module = agent, data, reward, mod


@pytest.fixture(scope="module")
def ex() -> Iterator[Example]:
    """The example's modules, loaded the way ``boltrl`` loads the agent file, without
    leaving its ``data`` / ``reward`` siblings (names other examples share) behind."""
    saved = {k: sys.modules.pop(k) for k in _SIBLINGS if k in sys.modules}
    path = list(sys.path)
    try:
        agent = load_object(f"{EXAMPLE / 'agent.py'}:agent", what="agent")
        yield Example(
            agent, sys.modules["data"], sys.modules["reward"], sys.modules[agent.__module__]
        )
    finally:
        for k in _SIBLINGS:
            sys.modules.pop(k, None)
        sys.modules.update(saved)
        sys.path[:] = path


def _hashes(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def _build(out: Path, *args: str) -> None:
    spec = importlib.util.spec_from_file_location("calc_agent_data_cli", EXAMPLE / "data.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(["--out", str(out), *args])


def test_builder_is_deterministic_and_the_shipped_data_is_its_output(
    tmp_path: Path, ex: Example
) -> None:
    _build(tmp_path / "a", "--seed", "0")
    _build(tmp_path / "b", "--seed", "0")
    _build(tmp_path / "c", "--seed", "1")
    a = _hashes(tmp_path / "a")
    assert set(a) == {"train.jsonl", "val.jsonl", "test.jsonl"}
    assert a == _hashes(tmp_path / "b")
    assert a == _hashes(EXAMPLE / "data"), "shipped data differs from `python data.py`"
    assert all(a[k] != v for k, v in _hashes(tmp_path / "c").items())

    splits = ex.data.build(0)
    assert {k: len(v) for k, v in splits.items()} == {"train": 300, "val": 60, "test": 60}
    questions = [t["question"] for tasks in splits.values() for t in tasks]
    assert len(questions) == len(set(questions)), "a question repeats across splits"
    for tasks in splits.values():
        assert [t["level"] for t in tasks[:8]] == [1, 2, 3, 4, 1, 2, 3, 4]
        for t in tasks:
            assert ex.module.evaluate(t["solution"]) == str(t["answer"]), t


def test_easy_train_is_the_shipped_levels_1_and_2(ex: Example) -> None:
    easy = ex.data.easy_train()
    assert easy == [t for t in ex.data.build(0)["train"] if t["level"] <= 2]
    assert len(easy) == 150


def test_hard_train_is_the_shipped_levels_3_and_4(ex: Example) -> None:
    hard = ex.data.hard_train()
    assert hard == [t for t in ex.data.build(0)["train"] if t["level"] >= 3]
    assert len(hard) == 150


def test_gsm8k_reader(tmp_path: Path, ex: Example) -> None:
    records = [
        {
            "question": "Tom has 3 bags of 4 apples. How many?",
            "answer": "3*4=<<3*4=12>>12\n#### 12",
        },
        {"question": "A car costs...", "answer": "So it is 1,250.\n#### 1,250"},
        {"question": "Half of 5?", "answer": "#### 2.5"},
    ]
    path = tmp_path / "test.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    tasks = ex.data.load_gsm8k(path)
    assert tasks == [
        {"id": "gsm8k-00000", "question": records[0]["question"], "answer": 12, "level": None,
         "solution": ""},
        {"id": "gsm8k-00001", "question": records[1]["question"], "answer": 1250, "level": None,
         "solution": ""},
        {"id": "gsm8k-00002", "question": records[2]["question"], "answer": 2.5, "level": None,
         "solution": ""},
    ]  # fmt: skip
    assert ex.data.gold_answer(records[1]) == 1250  # a raw record works as a task too
    with pytest.raises(ValueError, match="####"):
        ex.data.parse_gsm8k_answer("no final answer")


@pytest.mark.parametrize(
    ("reply", "gold", "reward"),
    [
        ("Answer: 56", 56, 1.0),
        ("56", 56, 1.0),
        ("4 * 12 + 8 = 56", 56, 1.0),
        ("The answer is 56.0 (that is 7 * 8).", 56, 1.0),
        ("Answer: 1,234", 1234, 1.0),
        ("Answer: -3", -3, 1.0),
        ("Answer: 2.5", 2.5, 1.0),
        ("Answer: 57", 56, 0.0),
        ("56 apples minus 3 leaves 53", 56, 0.0),
        ("Answer: 5.6", 56, 0.0),
        (None, 56, 0.0),
        ("", 56, 0.0),
        ("I do not know.", 56, 0.0),
        ("Answer: fifty-six", 56, 0.0),
        ("Answer: 56", "not a number", 0.0),
    ],
)
def test_reward(ex: Example, reply: str | None, gold: Any, reward: float) -> None:
    assert ex.reward.exact_match(reply, gold) == reward


def test_calculator_evaluates_arithmetic_and_nothing_else(ex: Example) -> None:
    ev = ex.module.evaluate
    exprs = ["4 * 12 + 7", "7 / 2", "2 ** 10", "1,000 \u00d7 3", "-(3 + 4) % 5"]
    assert [ev(e) for e in exprs] == ["55", "3.5", "1024", "3000", "3"]
    assert ev("1 / 3") == "0.333333"
    for bad, why in [
        ("__import__('os').system('true')", "unsupported syntax: Call"),
        ("x + 1", "unsupported syntax: Name"),
        ("(1).real", "unsupported syntax: Attribute"),
        ("2 ** 100000", "exponents"),
        ("9 ** 9 ** 9", "exponents"),
        ("10 ** 12 * 10 ** 12 * 10 ** 12", "too large"),
        ("1 / 0", "division by zero"),
        ("1 +", "not an arithmetic expression"),
        ("1" + "+1" * 200, "longer than"),
        ("True + 1", "unsupported syntax: Constant"),
    ]:
        with pytest.raises(ValueError, match=why):
            ev(bad)


def _task(ex: Example) -> dict[str, Any]:
    return ex.data.build(0)["val"][3]  # a level-4 problem


def test_correct_trajectory(ex: Example) -> None:
    task = _task(ex)
    script = [
        {"tool_calls": [{"name": "calculator", "arguments": {"expression": task["solution"]}}]},
        f"The calculator says {task['answer']}. Answer: {task['answer']}",
    ]
    rollout = boltrl.run_rollout(ex.agent, task, backend=ScriptedBackend(script))
    assert rollout.status == RolloutStatus.SUCCEEDED, rollout.error
    assert rollout.reward == 1.0
    assert rollout.unjoined_calls == 0
    assert [c.agent for c in rollout.calls] == ["solver", "solver"]
    assert [c.response["message"]["tool_calls"][0]["function"]["name"] for c in rollout.calls[:1]]
    assert [
        (s.agent, s.name, s.arguments, s.result, s.error, s.call_id, s.tool_call_id)
        for s in rollout.tool_steps
    ] == [
        (
            "solver",
            "calculator",
            {"expression": task["solution"]},
            str(task["answer"]),
            None,
            rollout.calls[0].id,
            "call_0_0",
        )
    ]
    # the second call saw the calculator's result
    assert rollout.calls[1].request["messages"][-1]["content"] == str(task["answer"])


def test_wrong_trajectories(ex: Example) -> None:
    task = _task(ex)
    wrong = [
        {"tool_calls": [{"name": "calculator", "arguments": {"expression": "2 + 2"}}]},
        "Answer: 4",
    ]
    rollout = boltrl.run_rollout(ex.agent, task, backend=ScriptedBackend(wrong))
    assert (rollout.status, rollout.reward, rollout.unjoined_calls) == (
        RolloutStatus.SUCCEEDED,
        0.0,
        0,
    )
    assert [(s.name, s.result) for s in rollout.tool_steps] == [("calculator", "4")]

    # a malformed expression: the tool's error is recorded and the episode goes on
    bad = [
        {"tool_calls": [{"name": "calculator", "arguments": {"expression": "open('x')"}}]},
        "I could not compute it.",
    ]
    rollout = boltrl.run_rollout(ex.agent, task, backend=ScriptedBackend(bad))
    assert (rollout.status, rollout.reward, rollout.unjoined_calls) == (
        RolloutStatus.SUCCEEDED,
        0.0,
        0,
    )
    [step] = rollout.tool_steps
    assert step.result is None and "unsupported syntax: Call" in (step.error or "")


def test_a_raw_gsm8k_record_is_a_task(ex: Example) -> None:
    record = {"question": "What is 6 times 7?", "answer": "6*7=42\n#### 42"}
    rollout = boltrl.run_rollout(ex.agent, record, backend=ScriptedBackend(["Answer: 42"]))
    assert (rollout.status, rollout.reward, [c.agent for c in rollout.calls]) == (
        RolloutStatus.SUCCEEDED,
        1.0,
        ["solver"],
    )


def test_configs_validate_and_so_does_the_gpu_setting(tmp_path: Path) -> None:
    from boltrl_trainer.config import load_config

    for name in ("train.yaml", "eval.yaml"):
        assert load_config(EXAMPLE / name).tasks.val is not None, name
    # train.yaml's commented GPU block, uncommented (what the README tells users to do)
    head, _, gpu = (EXAMPLE / "train.yaml").read_text().partition("\n# GPU")
    block = "\n".join(line[2:] for line in gpu.splitlines()[1:] if line.startswith("# "))
    (tmp_path / "gpu.yaml").write_text(head + "\n" + block + "\n")
    cfg = load_config(tmp_path / "gpu.yaml")
    assert (cfg.backend, cfg.model, cfg.dtype) == ("verl", "Qwen/Qwen2.5-1.5B-Instruct", "bfloat16")
    assert cfg.verl is not None and cfg.verl.tool_call_parser == "hermes"
    assert cfg.tasks.train is not None and cfg.tasks.train.endswith("data/train.jsonl")


def test_boltrl_eval_on_the_tiny_model(tmp_path: Path) -> None:
    from boltrl_trainer.models import tiny_model

    report = tmp_path / "eval.json"
    args = f"eval {EXAMPLE / 'eval.yaml'} --split val --limit 2 --report {report}".split()
    for setting in (
        f"model={tiny_model()}",
        "max_tokens=8",
        "progress=false",
        f"out_dir={tmp_path}",
    ):
        args += ["--set", setting]
    proc = subprocess.run(
        [sys.executable, "-m", "boltrl.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines()[0].split() == ["split", "tasks", "reward", "±", "std", "failed"]
    assert proc.stdout.splitlines()[1].split()[:2] == ["val", "2"]
    data = json.loads(report.read_text())
    assert data["splits"]["val"]["tasks"] == 2
    assert [t["status"] for t in data["splits"]["val"]["per_task"]] == ["succeeded"] * 2
