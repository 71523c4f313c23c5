"""The verl backend for real: verl's FSDP actor and vLLM server on the machine's GPUs.

Marked ``gpu`` and skipped without CUDA; in the GPU environment of docs/gpu.md run
``pytest -m gpu tests/trainer/test_verl_gpu.py``. Each test starts verl (Ray, the FSDP
workers, a vLLM server): minutes, not seconds. The model is a tiny random Llama (2
layers, hidden 256, head size 128 so vLLM's attention kernels take it) with SmolLM2's
tokenizer, built locally: no download. ``BOLTRL_VERL_TEST_MODEL`` names another (e.g.
``Qwen/Qwen2.5-0.5B-Instruct``).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from trainer_harness import VOWEL_AGENT

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def _model() -> str:
    from boltrl_trainer.models import tiny_model

    return os.environ.get("BOLTRL_VERL_TEST_MODEL") or str(
        tiny_model(hidden=256, heads=2, kv_heads=1)
    )


def _config(out: Path, **over: Any) -> dict[str, Any]:
    return {
        "agent": "agent.py:agent",
        "tasks": {"train": "train.jsonl"},
        "backend": "verl",
        "model": _model(),
        "dtype": "bfloat16",
        "steps": 2,
        "batch_tasks": 2,
        "group_size": 4,
        "concurrency": 8,
        "max_tokens": 16,
        "optim": {"lr": 1e-3, "token_budget": 2048},
        "val_every": 0,
        "out_dir": str(out),
        "progress": False,
        "verl": {
            "n_gpus_per_node": torch.cuda.device_count(),
            "gpu_memory_utilization": 0.3,
            "enforce_eager": True,
            "max_model_len": 1024,
        },
        **over,
    }


@pytest.mark.timeout(1800)
def test_two_verl_steps_through_boltrl_train(tmp_path: Path) -> None:
    import yaml

    (tmp_path / "agent.py").write_text(VOWEL_AGENT)
    (tmp_path / "train.jsonl").write_text(
        "".join(json.dumps({"prompt": f"Say something about {i}."}) + "\n" for i in range(4))
    )
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(_config(tmp_path / "out")))
    proc = subprocess.run(
        [sys.executable, "-m", "boltrl.cli", "train", "train.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    rows = [json.loads(ln) for ln in (tmp_path / "out/metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "update/loss" in r]
    assert [r["policy_version"] for r in steps] == [1, 2]
    for r in steps:
        assert r["update/rows"] >= 1 and r["update/tokens"] >= 1
        assert r["update/pad_rows"] == -r["update/rows"] % torch.cuda.device_count()
    assert (tmp_path / "out/checkpoints/step-000002/actor").is_dir()


@pytest.mark.timeout(1800)
def test_an_update_reaches_the_vllm_engine(tmp_path: Path) -> None:
    from boltrl.gateway.backend import GenerationRequest
    from boltrl.records import Transition
    from boltrl_trainer.config import load_config
    from boltrl_trainer.seams import TrainBatch, weight_swap
    from boltrl_trainer.verl.backend import build_verl

    cfg = load_config(data=_config(tmp_path / "out", lora=None, agent="a.py:f"))
    pool, trainer = build_verl(cfg)
    try:
        request = GenerationRequest(
            messages=[{"role": "user", "content": "Name a colour."}],
            temperature=1.0,
            max_tokens=8,
            seed=0,
            rollout_id="r0",
        )
        before = asyncio.run(pool.generate(request))
        assert before.prompt_token_ids and before.response_token_ids and before.response_logprobs
        assert before.policy_version == 0
        sample = Transition(
            rollout_id="r0",
            task_id="t0",
            group="t0",
            step=0,
            agent=None,
            state=before.prompt_token_ids,
            action=before.response_token_ids,
            action_logprobs=before.response_logprobs,
            action_mask=[1] * len(before.response_token_ids),
            reward=1.0,
            done=True,
            policy_version=0,
            call_ids=["c0"],
        )
        with weight_swap(pool, trainer):
            metrics = trainer.update(TrainBatch([sample] * 2, [1.0, 1.0], 0, 1.0))
        version = trainer.policy_version
        assert version == 1 and pool.policy_version == 1
        assert metrics["update/rows"] == 2.0 and abs(metrics["update/logprob_mismatch"]) < 1.0
        after = asyncio.run(pool.generate(request))
        assert after.policy_version == 1
        # the same seed: a changed answer or changed logprobs mean new weights serve
        assert (after.response_token_ids, after.response_logprobs) != (
            before.response_token_ids,
            before.response_logprobs,
        )
        trainer.save(tmp_path / "ckpt")
        with weight_swap(pool, trainer):
            trainer.load(tmp_path / "ckpt", policy_version=trainer.policy_version)
        assert asyncio.run(pool.generate(request)).response_token_ids
    finally:
        pool.close()
        trainer.close()
