"""A real learning run (slow; `uv run pytest -m slow`): GRPO raises the tiny model's
reward on a toy task well above where it started."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from boltrl_trainer.config import load_config
from boltrl_trainer.loop import Trainer
from boltrl_trainer.models import tiny_model

AGENT = textwrap.dedent(
    """
    from openai import OpenAI

    _client = None

    def agent(task, llm):
        global _client
        if _client is None:
            _client = OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
        reply = _client.with_options(base_url=llm.base_url).chat.completions.create(
            model=llm.model, messages=[{"role": "user", "content": task["prompt"]}]
        )
        text = reply.choices[0].message.content or ""
        # toy task: say as many vowels as possible
        return sum(c in "aeiou" for c in text) / max(len(text), 1)
    """
)


@pytest.mark.slow
def test_grpo_raises_reward_on_a_toy_task(tmp_path: Path) -> None:
    (tmp_path / "agent.py").write_text(AGENT)
    with (tmp_path / "train.jsonl").open("w") as f:
        for i in range(16):
            f.write(json.dumps({"id": f"t{i}", "prompt": f"Task number {i}."}) + "\n")
    cfg = load_config(
        data={
            "agent": str(tmp_path / "agent.py") + ":agent",
            "tasks": {"train": str(tmp_path / "train.jsonl")},
            "model": str(tiny_model()),
            "steps": 30,
            "batch_tasks": 4,
            "group_size": 8,
            "concurrency": 32,
            "max_tokens": 8,
            "lora": None,
            "optim": {"lr": 3e-3},
            "out_dir": str(tmp_path / "out"),
            "progress": False,
        }
    )
    Trainer(cfg).run()
    rows = [json.loads(x) for x in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    rewards = [r["train/reward_mean"] for r in rows if "train/reward_mean" in r]
    start = sum(rewards[:3]) / 3
    end = sum(rewards[-5:]) / 5
    assert end > start + 0.15, (start, end, rewards)
