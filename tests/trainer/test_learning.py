"""A real learning run (slow; `uv run pytest -m slow`): GRPO through the whole framework
raises SmolLM2-135M-Instruct's held-out reward on the demo task within a few steps.

A tiny random model is no use here: its next-token distribution is uniform over 49k
tokens, so no reward that text can express moves within a test's budget."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from boltrl_trainer.config import load_config
from boltrl_trainer.demo import DEMO_CONFIG
from boltrl_trainer.trainer import Trainer


@pytest.mark.slow
def test_grpo_raises_held_out_reward_on_the_demo_task(tmp_path: Path) -> None:
    cfg = load_config(
        data={
            **DEMO_CONFIG,
            "steps": 6,
            "val_every": 0,
            "tasks": {**DEMO_CONFIG["tasks"], "limit_val": 32},
            "out_dir": str(tmp_path / "out"),
            "progress": False,
        }
    )
    result = Trainer(cfg, run_name="learning-test").run()
    assert result.val_before is not None and result.val_after is not None
    rows = [json.loads(x) for x in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    train = [r["train/reward_mean"] for r in rows if "train/reward_mean" in r]
    assert result.val_after > result.val_before + 0.05, (result.val_history, train)
    assert sum(train[-2:]) > sum(train[:2]), train
