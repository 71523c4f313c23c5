"""``boltrl train`` / ``boltrl eval`` through the real CLI on the tiny random model:
real generation through the gateway, real updates, checkpoints and ``--resume``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file
from trainer_harness import VOWEL_AGENT, read_jsonl, run_cli, run_cli_ok, write_project

from boltrl_trainer.config import load_config
from boltrl_trainer.models import tiny_model


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("train")
    cfg = {
        "agent": "agent.py:agent",
        "model": str(tiny_model()),
        "steps": 2,
        "batch_tasks": 2,
        "group_size": 3,
        "concurrency": 6,
        "max_tokens": 8,
        "temperature": 1.0,
        "lora": {"r": 4, "alpha": 8},
        "optim": {"lr": 0.01},
        "val_every": 1,
        "out_dir": str(d / "out"),
        "progress": False,
    }
    tasks = {
        "train": [{"id": f"t{i}", "prompt": f"Say something about {i}."} for i in range(6)],
        "val": [{"id": f"v{i}", "prompt": f"Describe {i}."} for i in range(3)],
    }
    return write_project(d, cfg, files={"agent.py": VOWEL_AGENT}, tasks=tasks)


def test_train_two_steps_then_resume(project: Path) -> None:
    out = project / "out"
    proc = run_cli_ok("train", "train.yaml", cwd=project)
    assert "val reward:" in proc.stdout

    rows = read_jsonl(out / "metrics.jsonl")
    steps = [r for r in rows if "update/loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert [r["policy_version"] for r in steps] == [1, 2]
    assert all(r["train/rollouts"] == 6 and r["train/failed"] == 0 for r in steps)
    assert all(r["update/tokens"] > 0 for r in steps), "nothing was trained on"
    assert [r["step"] for r in rows if "val/reward_mean" in r] == [0, 1, 2]
    assert (out / "reward.png").stat().st_size > 1000
    assert any((out / "tensorboard").iterdir())

    ckpt = out / "checkpoints" / "step-000002"
    assert (out / "checkpoints" / "latest").read_text() == ckpt.name
    state = json.loads((ckpt / "state.json").read_text())
    assert state["step"] == 2 and state["policy_version"] == 2
    weights = load_file(str(ckpt / "trainable.safetensors"))
    lora_b = [v for k, v in weights.items() if "lora_B" in k]
    assert lora_b and any(float(v.abs().sum()) > 0 for v in lora_b), "LoRA weights unchanged"

    proc = run_cli_ok("train", "train.yaml", "--resume", "--set", "steps=3", cwd=project)
    assert "resumed from" in proc.stdout
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in rows if "update/loss" in r] == [1, 2, 3]
    assert (
        json.loads((out / "checkpoints" / "step-000003" / "state.json").read_text())[
            "policy_version"
        ]
        == 3
    )
    resumed = load_file(str(out / "checkpoints" / "step-000003" / "trainable.safetensors"))
    assert any(not bool((resumed[k] == weights[k]).all()) for k in weights if "lora_B" in k), (
        "the resumed step did not change the weights"
    )


def test_eval_writes_its_table(project: Path) -> None:
    proc = run_cli_ok(
        "eval",
        "train.yaml",
        "--split",
        "val",
        "--split",
        "train",
        "--limit",
        "2",
        "--report",
        str(project / "eval.json"),
        cwd=project,
    )
    assert "split" in proc.stdout and "val" in proc.stdout
    report = json.loads((project / "eval.json").read_text())
    assert set(report["splits"]) == {"val", "train"}
    assert report["splits"]["val"]["tasks"] == 2


def test_config_errors_name_the_field(project: Path) -> None:
    from boltrl.errors import InvalidInput

    with pytest.raises(InvalidInput, match=r"steps: Input should be greater than or equal to 0"):
        load_config(project / "train.yaml", ["steps=-1"])
    with pytest.raises(InvalidInput, match=r"optim.lrr: unknown field"):
        load_config(project / "train.yaml", ["optim.lrr=0.1"])
    proc = run_cli("train", "train.yaml", "--set", "algo.clip_eps_low=2", cwd=project)
    assert proc.returncode == 2
    assert "clip_eps_low" in proc.stderr
