"""Warm start through the real CLI on the tiny random model: ``boltrl sft``, then
``boltrl train`` with a ``warm_start:`` section (warm start -> RL) and with ``init_from``;
and the RL update refusing demonstrations."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from safetensors.torch import load_file
from trainer_harness import read_jsonl, run_cli_ok, write_project

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
    cfg = {
        "agent": "agent.py:agent",
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
    tasks = {
        split: [{"id": f"{split[0]}{i}", "prompt": f"Is {i} a number?"} for i in ids]
        for split, ids in (("train", range(8)), ("val", range(20, 24)))
    }
    return write_project(d, cfg, files={"agent.py": AGENT, "teacher.py": TEACHER}, tasks=tasks)


TIMEOUT = 300  # an SFT run and an RL run each


def test_sft_then_train_from_its_checkpoint(project: Path) -> None:
    out = project / "sft"
    proc = run_cli_ok("sft", "train.yaml", "--out", str(out), cwd=project, timeout=TIMEOUT)
    assert "demonstrations: 8 of 8 rollouts kept (8 transitions" in proc.stdout
    assert "val reward: 0.000 -> 1.000" in proc.stdout, proc.stdout

    rows = read_jsonl(out / "warm_start" / "metrics.jsonl")
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
    proc = run_cli_ok(
        "train", "train.yaml", "--out", str(rl), "--set", "warm_start=null",
        "--set", f"init_from={out / 'warm_start'}", cwd=project, timeout=TIMEOUT,
    )  # fmt: skip
    vals = [
        r["val/reward_mean"] for r in read_jsonl(rl / "metrics.jsonl") if "val/reward_mean" in r
    ]
    assert vals[0] == 1.0, vals
    # version 2 when the step updated; at temperature 1.0 the warm-started model can say
    # "yes" in every sample, and then both groups are all-equal and the update is skipped
    updated = not [r for r in read_jsonl(rl / "metrics.jsonl") if r.get("update/skipped")]
    final = json.loads((rl / "checkpoints" / "step-000001" / "state.json").read_text())
    assert final["policy_version"] == (2 if updated else 1), final


def test_train_runs_the_warm_start_then_rl(project: Path) -> None:
    out = project / "both"
    proc = run_cli_ok("train", "train.yaml", "--out", str(out), cwd=project, timeout=TIMEOUT)
    assert "warm start val before: reward 0.000" in proc.stdout, proc.stdout
    warm = read_jsonl(out / "warm_start" / "metrics.jsonl")
    assert [r["step"] for r in warm if "sft/loss" in r] == list(range(1, 13))
    rl = read_jsonl(out / "metrics.jsonl")
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
