"""Warm start through the real CLI on the tiny random model: ``boltrl sft``, then
``boltrl train`` with a ``warm_start:`` section (warm start -> RL) and with ``init_from``;
and the RL update refusing demonstrations."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file

from boltrl.errors import InvalidInput
from boltrl.records import Transition
from boltrl.store import open_store
from boltrl_trainer.models import tiny_model

AGENT = textwrap.dedent(
    """
    from openai import OpenAI

    def agent(task, llm):
        client = OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
        reply = client.chat.completions.create(
            model=llm.model, messages=[{"role": "user", "content": task["prompt"]}]
        )
        return 1.0 if (reply.choices[0].message.content or "").strip() == "yes" else 0.0
    """
)

TEACHER = textwrap.dedent(
    """
    def teach(task, request):
        return "yes"
    """
)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("warm")
    (d / "agent.py").write_text(AGENT)
    (d / "teacher.py").write_text(TEACHER)
    (d / "train.jsonl").write_text(
        "".join(json.dumps({"id": f"t{i}", "prompt": f"Is {i} a number?"}) + "\n" for i in range(8))
    )
    (d / "val.jsonl").write_text(
        "".join(
            json.dumps({"id": f"v{i}", "prompt": f"Is {i} a number?"}) + "\n" for i in range(20, 24)
        )
    )
    cfg = {
        "agent": "agent.py:agent",
        "tasks": {"train": "train.jsonl", "val": "val.jsonl"},
        "model": str(tiny_model()),
        "steps": 1,
        "batch_tasks": 2,
        "group_size": 2,
        "concurrency": 4,
        "max_tokens": 8,
        "temperature": 1.0,
        "lora": None,
        "optim": {"lr": 1e-6},
        "val_every": 0,
        "out_dir": str(d / "out"),
        "progress": False,
        "warm_start": {"teacher": "teacher.py:teach", "epochs": 6, "lr": 1e-2, "batch_size": 4},
    }
    (d / "train.yaml").write_text(yaml.safe_dump(cfg))
    return d


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "boltrl.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"},
    )


def _rows(path: Path) -> list[dict[str, float]]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_sft_then_train_from_its_checkpoint(project: Path) -> None:
    out = project / "sft"
    proc = _cli("sft", "train.yaml", "--out", str(out), cwd=project)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "demonstrations: 8 of 8 rollouts kept (8 transitions" in proc.stdout
    assert "val reward: 0.000 -> 1.000" in proc.stdout, proc.stdout

    rows = _rows(out / "warm_start" / "metrics.jsonl")
    losses = [r["sft/loss"] for r in rows if "sft/loss" in r]
    assert len(losses) == 6 * 2  # 8 demonstrations in batches of 4, 6 epochs
    assert losses[-1] < 0.2 * losses[0], losses
    assert [r["val/reward_mean"] for r in rows if "val/reward_mean" in r] == [0.0, 1.0]
    ckpt = out / "warm_start" / "checkpoints" / "step-000012"
    assert (out / "warm_start" / "checkpoints" / "latest").read_text() == ckpt.name
    state = json.loads((ckpt / "state.json").read_text())
    assert state["kind"] == "warm_start" and state["policy_version"] == 1
    assert set(load_file(str(ckpt / "trainable.safetensors"))), "no weights saved"

    # the demonstrations are in the run's store, marked as such
    store = open_store(f"sqlite:///{out / 'store.db'}")
    demo_calls = [
        c
        for r in store.query(limit=1000)
        if r.task.metadata.get("phase") == "warm_start"
        for c in store.get(r.id).calls
    ]
    store.close()
    assert len(demo_calls) == 8
    assert all(c.demonstration == "function:teacher.py:teach" for c in demo_calls)
    assert all(c.response_logprobs is None for c in demo_calls)

    # RL from that checkpoint: it starts where the warm start ended (greedy val 1.0, not
    # the base model's 0.0) and continues its version numbering
    rl = project / "rl"
    proc = _cli(
        "train", "train.yaml", "--out", str(rl), "--set", "warm_start=null",
        "--set", f"init_from={out / 'warm_start'}", cwd=project,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    vals = [r["val/reward_mean"] for r in _rows(rl / "metrics.jsonl") if "val/reward_mean" in r]
    assert vals[0] == 1.0, vals
    final = json.loads((rl / "checkpoints" / "step-000001" / "state.json").read_text())
    assert final["policy_version"] == 2


def test_train_runs_the_warm_start_then_rl(project: Path) -> None:
    out = project / "both"
    proc = _cli("train", "train.yaml", "--out", str(out), cwd=project)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "warm start val before: reward 0.000" in proc.stdout, proc.stdout
    warm = _rows(out / "warm_start" / "metrics.jsonl")
    assert [r["step"] for r in warm if "sft/loss" in r] == list(range(1, 13))
    rl = _rows(out / "metrics.jsonl")
    assert [r["val/reward_mean"] for r in rl if "val/reward_mean" in r] == [1.0, 1.0]
    steps = [r for r in rl if "update/loss" in r or "update/skipped" in r]
    assert [r["policy_version"] for r in steps] == [2] or steps[0].get("update/skipped")
    assert (out / "warm_start" / "checkpoints" / "step-000012").is_dir()
    assert not (out / "warm_start" / "rl_start.tmp").exists()


def test_the_rl_update_refuses_demonstrations() -> None:
    from boltrl_trainer.seams import TrainBatch

    demo = Transition(
        rollout_id="r1", task_id="t", group="t", step=0, agent=None, state=[1, 2], action=[3, 2],
        action_logprobs=[0.0, 0.0], action_mask=[1, 1], reward=1.0, done=True,
        policy_version=0, call_ids=["c1"], demonstration="function:teacher.py:teach",
    )  # fmt: skip
    sampled = demo.model_copy(update={"demonstration": None, "action_logprobs": [-0.5, -0.1]})
    assert TrainBatch([sampled], [1.0], 0, 1.0).transitions == [sampled]
    with pytest.raises(InvalidInput, match=r"transitions: 1 are demonstrations .*boltrl sft"):
        TrainBatch([sampled, demo], [1.0, 1.0], 0, 1.0)
    assert Transition.model_validate_json(demo.model_dump_json()) == demo


def test_init_from_and_backend_errors_name_the_field(project: Path, tmp_path: Path) -> None:
    from boltrl_trainer.config import load_config
    from boltrl_trainer.warm_start import checkpoint_path, prepare_policy

    with pytest.raises(InvalidInput, match=r"init_from: .* holds no boltrl checkpoint"):
        checkpoint_path(tmp_path)
    cfg = load_config(project / "train.yaml", ["backend=verl"])
    with pytest.raises(InvalidInput, match=r"warm_start / init_from: the torch backend only"):
        prepare_policy(
            cfg,
            agent=None,
            server=None,
            trainer=None,
            store=None,
            out_dir=tmp_path,  # type: ignore[arg-type]
        )
    with pytest.raises(InvalidInput, match=r"warm_start.teacher.model.model: Field required"):
        load_config(project / "train.yaml", ["warm_start.teacher={base_url: x}"])
