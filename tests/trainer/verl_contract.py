"""Checks of boltrl's verl conversion and config against a real verl 0.9 install.

Run by ``test_verl_real.py`` with the Python of a virtual environment that has verl
(CPU torch is enough); it is not collected by pytest itself. Prints ``OK <check>`` per
passed check and exits non-zero on the first failure.
"""

from __future__ import annotations

import math
import random
import warnings

warnings.filterwarnings("ignore")

import torch  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla  # noqa: E402
from verl.trainer.ppo.ray_trainer import compute_advantage  # noqa: E402
from verl.trainer.ppo.utils import need_critic, need_reference_policy  # noqa: E402
from verl.utils.config import omega_conf_to_dataclass, validate_config  # noqa: E402
from verl.workers.utils.padding import left_right_2_no_padding  # noqa: E402

from boltrl.records import Transition  # noqa: E402
from boltrl_trainer.algorithms import GRPOConfig, compute_advantages, policy_loss  # noqa: E402
from boltrl_trainer.batching import index_rollouts  # noqa: E402
from boltrl_trainer.config import load_config  # noqa: E402
from boltrl_trainer.verl.backend import compose_verl_config  # noqa: E402
from boltrl_trainer.verl.config import verl_overrides  # noqa: E402
from boltrl_trainer.verl.convert import to_dataproto, transitions_to_verl  # noqa: E402


def transitions(seed: int = 0) -> list[Transition]:
    """3 groups x 4 rollouts, 1-2 steps each, with observation tokens in some actions."""
    rng = random.Random(seed)
    out = []
    for g in range(3):
        for r in range(4):
            reward = float(rng.random() < 0.5) + 0.1 * r
            for step in range(1 + (r % 2)):
                a = rng.randint(1, 9)
                mask = [1] * a
                if a > 3 and step == 1:
                    mask[1:3] = [0, 0]
                out.append(
                    Transition(
                        rollout_id=f"r{g}-{r}",
                        task_id=f"t{g}",
                        group=f"g{g}",
                        step=step,
                        agent=None,
                        state=[rng.randint(3, 500) for _ in range(rng.randint(1, 12))],
                        action=[rng.randint(3, 500) for _ in range(a)],
                        action_logprobs=[-rng.random() * m for m in mask],
                        action_mask=mask,
                        reward=reward,
                        done=step == r % 2,
                        policy_version=0,
                        call_ids=[f"c{g}{r}{step}"],
                    )
                )
    return out


def check_config() -> None:
    cfg = load_config(
        data={
            "agent": "a:b",
            "backend": "verl",
            "model": "Qwen/Qwen2.5-Coder-1.5B-Instruct",
            "dtype": "bfloat16",
            "algo": {"kl_coef": 0.01, "clip_eps_high": 0.28},
            "verl": {
                "n_gpus_per_node": 8,
                "rollout_tp": 2,
                "micro_batch_size_per_gpu": 2,
                "tool_call_parser": "hermes",
            },
        }
    )
    config = compose_verl_config(verl_overrides(cfg))  # struct mode: every key exists
    OmegaConf.resolve(config)
    validate_config(config, need_reference_policy(config), need_critic(config))
    assert need_reference_policy(config) and not need_critic(config)
    actor = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
    assert (actor.clip_ratio_low, actor.clip_ratio_high) == (0.2, 0.28)
    assert actor.use_kl_loss and actor.kl_loss_coef == 0.01
    assert actor.ppo_micro_batch_size_per_gpu == 2 and not actor.use_dynamic_bsz
    rollout = omega_conf_to_dataclass(config.actor_rollout_ref.rollout)
    assert rollout.tensor_model_parallel_size == 2 and rollout.n == 1
    assert rollout.engine_kwargs["vllm"] == {
        "enable_auto_tool_choice": True,
        "tool_call_parser": "hermes",
    }
    assert config.actor_rollout_ref.model.lora.merge and config.actor_rollout_ref.model.lora_rank
    print("OK config composes, validates and converts to verl's dataclasses")


def check_dataproto() -> None:
    items = transitions()
    adv = [random.Random(i).uniform(-1, 1) for i in range(len(items))]
    vb = transitions_to_verl(items, adv, pad_id=0, multiple=8)
    data = to_dataproto(vb)
    data.check_consistency()
    assert len(data) == len(vb) and len(data) % 8 == 0 and vb.pad_rows == len(data) - len(items)
    td = left_right_2_no_padding(data.to_tensordict())  # verl's own unpadding
    for i, t in enumerate(items):
        assert td["input_ids"][i].tolist() == t.state + t.action, i
        assert td["position_ids"][i].tolist() == list(range(len(t.state) + len(t.action)))
    loss_mask = td["loss_mask"]
    for i, t in enumerate(items):
        assert loss_mask[i, : len(t.action)].tolist() == t.action_mask
    print("OK DataProto: consistent, and verl's unpadding gives back the exact token ids")


def check_grpo_advantages() -> None:
    """verl's GRPO on rewards at the last token == boltrl's GRPO (one step per rollout)."""
    items = [t for t in transitions() if t.step == 0]
    data = compute_advantage(
        to_dataproto(transitions_to_verl(items, None, pad_id=0, multiple=4)),
        adv_estimator="grpo",
        num_repeat=1,
        norm_adv_by_std_in_grpo=True,
    )
    ours = compute_advantages(items, None, GRPOConfig(skip_zero_variance=False)).advantages
    for i, t in enumerate(items):
        row = data.batch["advantages"][i, : len(t.action)]
        assert torch.allclose(row, torch.full_like(row, float(ours[i])), atol=1e-4), i
    assert data.batch["advantages"][len(items) :].abs().sum() == 0  # padding rows
    print("OK verl's GRPO over uid groups matches boltrl's GRPO")


def check_rollout_normalization() -> None:
    """verl's token-mean loss on scaled advantages == boltrl's rollout-normalized loss."""
    items = transitions(1)
    adv = [random.Random(10 + i).uniform(-1, 1) for i in range(len(items))]
    vb = transitions_to_verl(items, adv, pad_id=0, multiple=4)
    mask = vb.tensors["response_mask"]
    gen = torch.Generator().manual_seed(0)
    old = vb.tensors["rollout_log_probs"]
    new = old + 0.3 * torch.randn(old.shape, generator=gen)  # ratios in ~[0.4, 2.5]
    cfg = load_config(data={"agent": "a:b", "backend": "verl", "model": "m", "dtype": "bfloat16"})
    actor = omega_conf_to_dataclass(
        compose_verl_config(verl_overrides(cfg)).actor_rollout_ref.actor
    )
    verl_loss, _ = compute_policy_loss_vanilla(
        old, new, vb.tensors["advantages"], mask, "token-mean", actor
    )
    n = len(items)
    rows, tokens = index_rollouts(items)
    ours, _ = policy_loss(
        new[:n],
        old[:n],
        torch.tensor(adv),
        mask[:n].float(),
        torch.tensor(rows),
        GRPOConfig(),
        rollout_tokens=torch.tensor(tokens, dtype=torch.float32),
    )
    assert math.isclose(float(verl_loss), float(ours), rel_tol=1e-5, abs_tol=1e-7), (
        float(verl_loss),
        float(ours),
    )
    print("OK verl's token-mean loss equals boltrl's rollout-normalized loss")


if __name__ == "__main__":
    check_config()
    check_dataproto()
    check_grpo_advantages()
    check_rollout_normalization()
