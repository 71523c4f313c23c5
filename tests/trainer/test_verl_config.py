"""The ``verl:`` section: boltrl's settings mapped onto verl 0.9's ppo_trainer config, the
settings refused because they would do nothing, and the clear error when verl is not
installed (``boltrl train`` with ``backend: verl`` here, where it never is)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from boltrl.errors import InvalidInput
from boltrl_trainer.backends import BACKENDS, backend_for
from boltrl_trainer.config import TrainConfig, load_config
from boltrl_trainer.verl import INSTALL_COMMAND, VERL_VERSIONS, require_verl, verl_available
from boltrl_trainer.verl.config import (
    check,
    nominal_batch_size,
    raise_if_invalid,
    row_multiple,
    verl_overrides,
    verl_settings,
)

ROOT = Path(__file__).resolve().parents[2]
BASE: dict[str, Any] = {
    "agent": "agent.py:run",
    "backend": "verl",
    "model": "Qwen/Qwen2.5-Coder-1.5B-Instruct",
    "dtype": "bfloat16",
}


def cfg(**over: Any) -> TrainConfig:
    """A loaded config that passed the verl section's checks (the verl registry entry's
    ``check`` runs them before it asks for the GPU stack, which this machine lacks)."""
    c = load_config(data={**BASE, **over})
    raise_if_invalid(c)
    return c


def test_a_full_config_maps_onto_verl_keys() -> None:
    c = cfg(
        batch_tasks=6,
        group_size=4,
        steps=20,
        temperature=0.8,
        top_p=0.95,
        max_tokens=256,
        seed=7,
        out_dir="runs/sql",
        algo={"clip_eps_high": 0.28, "kl_coef": 0.001, "scale_by_std": False},
        lora={"r": 32, "alpha": 64, "target_modules": ["q_proj", "v_proj"]},
        optim={"lr": 2e-5, "epochs": 2, "weight_decay": 0.01, "grad_clip": 0.5},
        verl={
            "nnodes": 2,
            "n_gpus_per_node": 8,
            "rollout_tp": 2,
            "gpu_memory_utilization": 0.6,
            "micro_batch_size_per_gpu": 2,
            "max_model_len": 8192,
            "strategy": "fsdp2",
            "param_offload": True,
            "enforce_eager": True,
            "tool_call_parser": "hermes",
            "overrides": {"actor_rollout_ref.rollout.max_num_seqs": 512},
        },
    )
    a, r, ref = "actor_rollout_ref.actor", "actor_rollout_ref.rollout", "actor_rollout_ref.ref"
    m = "actor_rollout_ref.model"
    # 16 GPUs x 2 rows per micro-batch: 24 rollouts per step round up to 32
    assert (row_multiple(c), nominal_batch_size(c)) == (32, 32)
    assert verl_overrides(c) == {
        f"{m}.path": "Qwen/Qwen2.5-Coder-1.5B-Instruct",
        f"{m}.enable_gradient_checkpointing": True,
        f"{m}.lora_rank": 32,
        f"{m}.lora_alpha": 64,
        f"{m}.target_modules": ["q_proj", "v_proj"],
        f"{m}.lora.merge": True,
        f"{a}.strategy": "fsdp2",
        f"{a}.optim.lr": 2e-5,
        f"{a}.optim.weight_decay": 0.01,
        f"{a}.optim.betas": [0.9, 0.999],
        f"{a}.optim.clip_grad": 0.5,
        f"{a}.grad_clip": 0.5,
        f"{a}.ppo_epochs": 2,
        f"{a}.ppo_mini_batch_size": 32,
        f"{a}.use_dynamic_bsz": False,
        f"{a}.ppo_micro_batch_size_per_gpu": 2,
        f"{a}.ppo_max_token_len_per_gpu": 4096,
        f"{a}.clip_ratio_low": 0.2,
        f"{a}.clip_ratio_high": 0.28,
        f"{a}.loss_agg_mode": "token-mean",
        f"{a}.use_kl_loss": True,
        f"{a}.kl_loss_coef": 0.001,
        f"{a}.kl_loss_type": "low_var_kl",
        f"{a}.entropy_coeff": 0.0,
        f"{a}.data_loader_seed": 7,
        f"{a}.fsdp_config.param_offload": True,
        f"{a}.fsdp_config.optimizer_offload": False,
        f"{a}.fsdp_config.dtype": "bfloat16",
        f"{a}.fsdp_config.seed": 7,
        f"{ref}.fsdp_config.dtype": "bfloat16",
        f"{r}.name": "vllm",
        f"{r}.mode": "async",
        f"{r}.n": 1,
        f"{r}.dtype": "bfloat16",
        f"{r}.temperature": 0.8,
        f"{r}.top_p": 0.95,
        f"{r}.response_length": 256,
        f"{r}.seed": 7,
        f"{r}.tensor_model_parallel_size": 2,
        f"{r}.gpu_memory_utilization": 0.6,
        f"{r}.max_model_len": 8192,
        f"{r}.enforce_eager": True,
        f"{r}.calculate_log_probs": True,
        f"{r}.agent.num_workers": 1,
        f"{r}.max_num_seqs": 512,
        f"{r}.engine_kwargs.vllm": {"enable_auto_tool_choice": True, "tool_call_parser": "hermes"},
        f"{ref}.log_prob_use_dynamic_bsz": False,
        f"{ref}.log_prob_micro_batch_size_per_gpu": 2,
        f"{ref}.log_prob_max_token_len_per_gpu": 4096,
        f"{r}.log_prob_use_dynamic_bsz": False,
        f"{r}.log_prob_micro_batch_size_per_gpu": 2,
        f"{r}.log_prob_max_token_len_per_gpu": 4096,
        "data.train_batch_size": 32,
        "data.max_response_length": 256,
        "algorithm.adv_estimator": "grpo",
        "algorithm.norm_adv_by_std_in_grpo": False,
        "algorithm.use_kl_in_reward": False,
        "critic.enable": False,
        "trainer.nnodes": 2,
        "trainer.n_gpus_per_node": 8,
        "trainer.total_training_steps": 20,
        "trainer.project_name": "boltrl",
        "trainer.experiment_name": "sql",
        "trainer.default_local_dir": str(Path("runs/sql/verl")),
        "trainer.logger": ["console"],
        "trainer.val_before_train": False,
        "trainer.test_freq": -1,
        "trainer.save_freq": -1,
    }


def test_defaults_pack_micro_batches_by_tokens_and_train_the_full_model_without_lora() -> None:
    c = cfg(lora=None, optim={"token_budget": 8192})
    got = verl_overrides(c)
    assert got["actor_rollout_ref.actor.use_dynamic_bsz"] is True
    assert got["actor_rollout_ref.actor.ppo_max_token_len_per_gpu"] == 8192
    assert got["actor_rollout_ref.rollout.log_prob_use_dynamic_bsz"] is True
    assert got["actor_rollout_ref.model.lora_rank"] == 0
    assert got["actor_rollout_ref.model.lora.merge"] is False
    assert (row_multiple(c), nominal_batch_size(c)) == (1, 32)  # 8 tasks x 4, one GPU


def test_every_mapped_key_names_the_boltrl_setting_it_comes_from() -> None:
    fields = set(TrainConfig.model_fields) | {"(boltrl)", "grpo", "lora"}
    for s in verl_settings(cfg()):
        head = s.source.split(".")[0]
        assert head in fields or s.source.startswith(("verl.", "grpo.")), s


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"model": "smollm2"}, "model: 'smollm2' is the CPU default"),
        ({"device": "cuda:1"}, "device: 'cuda:1' does nothing with backend verl"),
        ({"dtype": "float32"}, "dtype: 'float32' is not supported by backend verl"),
        ({"verl": {"n_gpus_per_node": 4, "rollout_tp": 3}}, "verl.rollout_tp: 3 must divide"),
        (
            {"verl": {"nnodes": 3, "n_gpus_per_node": 4, "rollout_tp": 6}},
            "verl.rollout_tp: 6 spans nodes, so it must be a multiple of",
        ),
        (
            {"optim": {"token_budget": 2048}, "verl": {"micro_batch_size_per_gpu": 4}},
            "optim.token_budget: does nothing when verl.micro_batch_size_per_gpu is set",
        ),
        ({"lora": {"dropout": 0.1}}, "lora.dropout: 0.1 is not applied"),
        (
            {"verl": {"old_logprobs": "rollout", "log_prob_micro_batch_size_per_gpu": 8}},
            "verl.log_prob_micro_batch_size_per_gpu: does nothing",
        ),
        (
            {"algorithm": "reinforce", "verl": {"advantages": "verl"}},
            "verl.advantages: 'verl' has no estimator for algorithm reinforce",
        ),
        (
            {"algo": {"std_eps": 1e-3}, "verl": {"advantages": "verl"}},
            "grpo.std_eps: verl's GRPO estimator uses its own epsilon",
        ),
        (
            {"verl": {"overrides": {"actor_rollout_ref.actor.optim.lr": 1e-5}}},
            "verl.overrides: 'actor_rollout_ref.actor.optim.lr' is set by optim.lr",
        ),
        ({"backend": "torch", "verl": {}}, "verl: set, but backend is 'torch'"),
        ({"verl": {"rollout_tp": 0}}, r"verl.rollout_tp: Input should be greater than or equal"),
        ({"verl": {"n_gpu_per_node": 8}}, "verl.n_gpu_per_node: unknown field"),
    ],
)
def test_settings_that_would_do_nothing_are_refused_by_name(
    over: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidInput, match=re.escape(message) if "\\" not in message else message):
        cfg(**over)


def test_every_problem_is_listed_at_once_with_the_file_name(tmp_path: Path) -> None:
    path = tmp_path / "train.yaml"
    path.write_text(
        "agent: agent.py:run\nbackend: verl\ndevice: cpu\n"
        "verl:\n  n_gpus_per_node: 4\n  rollout_tp: 3\n"
    )
    with pytest.raises(InvalidInput) as e:
        backend_for(load_config(path))  # the config's problems, before the missing verl
    lines = str(e.value).splitlines()
    assert lines[0] == f"invalid config {path}:"
    assert [ln.split(":")[0].strip() for ln in lines[1:]] == [
        "model",
        "device",
        "dtype",
        "verl.rollout_tp",
    ]


def test_a_valid_verl_config_has_no_problems_and_torch_configs_are_untouched() -> None:
    assert check(cfg()) == []
    assert check(load_config(data={"agent": "a.py:f"})) == []


def test_the_registry_entries_check_their_own_settings() -> None:
    assert sorted(BACKENDS) == ["torch", "verl"]
    torch_cfg = load_config(data={"agent": "a.py:f"})
    assert backend_for(torch_cfg) is BACKENDS["torch"]
    with pytest.raises(InvalidInput, match="verl: set, but backend is 'torch'"):
        backend_for(load_config(data={"agent": "a.py:f", "verl": {}}))
    with pytest.raises(InvalidInput, match=r"^backend: 'verl' needs verl, vllm"):
        backend_for(cfg())  # a valid verl config, on a machine without verl


def test_the_requirements_file_pins_the_versions_the_code_checks() -> None:
    text = (ROOT / "packages/trainer/requirements-gpu.txt").read_text()
    pins = [ln.split("#")[0].strip() for ln in text.splitlines() if ln.startswith("verl")]
    assert pins == [f"verl[vllm]{VERL_VERSIONS}"]
    assert "packages/trainer/requirements-gpu.txt" in INSTALL_COMMAND


def test_without_verl_the_backend_says_how_to_install_it() -> None:
    assert not verl_available()  # the workspace never installs the GPU stack
    with pytest.raises(InvalidInput) as e:
        require_verl()
    assert str(e.value).startswith("backend: 'verl' needs verl, vllm")
    assert INSTALL_COMMAND in str(e.value)


def test_boltrl_train_with_backend_verl_fails_clearly_without_verl(tmp_path: Path) -> None:
    (tmp_path / "agent.py").write_text("def run(task, llm):\n    return 1.0\n")
    (tmp_path / "tasks.jsonl").write_text('{"q": 1}\n')
    (tmp_path / "train.yaml").write_text(
        "agent: agent.py:run\ntasks:\n  train: tasks.jsonl\nbackend: verl\n"
        "model: Qwen/Qwen2.5-Coder-1.5B-Instruct\ndtype: bfloat16\n"
        f"out_dir: {tmp_path / 'out'}\nverl:\n  n_gpus_per_node: 2\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "boltrl.cli", "train", str(tmp_path / "train.yaml")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode != 0
    assert "backend: 'verl' needs verl, vllm" in proc.stderr
    assert INSTALL_COMMAND in proc.stderr
    assert "Traceback" not in proc.stderr


def test_importing_the_trainer_and_its_verl_config_loads_no_gpu_stack() -> None:
    code = (
        "import sys, boltrl_trainer, boltrl_trainer.config, boltrl_trainer.verl.config\n"
        "print(sorted(m for m in ('verl', 'vllm', 'ray', 'hydra') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
