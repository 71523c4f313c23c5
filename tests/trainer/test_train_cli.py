"""``boltrl train`` / ``boltrl eval`` through the real CLI on the tiny random model:
real generation through the gateway, real updates, checkpoints and ``--resume``."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file

from boltrl_trainer.config import load_config
from boltrl_trainer.models import tiny_model

AGENT = textwrap.dedent(
    """
    from openai import OpenAI

    def agent(task, llm):
        client = OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
        reply = client.chat.completions.create(
            model=llm.model, messages=[{"role": "user", "content": task["prompt"]}]
        )
        text = reply.choices[0].message.content or ""
        # a reward with spread even for a random model: share of vowels in the reply
        return sum(c in "aeiou" for c in text) / max(len(text), 1)
    """
)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("train")
    (d / "agent.py").write_text(AGENT)
    with (d / "train.jsonl").open("w") as f:
        for i in range(6):
            f.write(json.dumps({"id": f"t{i}", "prompt": f"Say something about {i}."}) + "\n")
    with (d / "val.jsonl").open("w") as f:
        for i in range(3):
            f.write(json.dumps({"id": f"v{i}", "prompt": f"Describe {i}."}) + "\n")
    cfg = {
        "agent": "agent.py:agent",
        "tasks": {"train": "train.jsonl", "val": "val.jsonl"},
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
    (d / "train.yaml").write_text(yaml.safe_dump(cfg))
    return d


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "boltrl.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=240,
        env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"},
    )


def test_train_two_steps_then_resume(project: Path) -> None:
    out = project / "out"
    proc = _cli("train", "train.yaml", cwd=project)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "val reward:" in proc.stdout

    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
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

    proc = _cli("train", "train.yaml", "--resume", "--set", "steps=3", cwd=project)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resumed from" in proc.stdout
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
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
    proc = _cli(
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
    assert proc.returncode == 0, proc.stderr[-3000:]
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
    proc = _cli("train", "train.yaml", "--set", "algo.clip_eps_low=2", cwd=project)
    assert proc.returncode == 2
    assert "clip_eps_low" in proc.stderr
