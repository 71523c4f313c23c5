"""GRPO / RLOO / REINFORCE advantages and the clipped, per-rollout-normalized policy loss,
checked against hand-computed numbers."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch.testing import assert_close

from boltrl.errors import InvalidInput
from boltrl.records import Transition
from boltrl_trainer.algorithms import (
    ALGORITHMS,
    GRPOConfig,
    ReinforceConfig,
    RLOOConfig,
    RunningBaseline,
    compute_advantages,
    make_config,
    policy_loss,
    token_weights,
)


def tr(rid: str, group: str, reward: float, step: int = 0, tokens: int = 2) -> Transition:
    return Transition(
        rollout_id=rid,
        task_id=group,
        group=group,
        step=step,
        agent=None,
        state=[1, 2, 3],
        action=[4] * tokens,
        action_logprobs=[-0.5] * tokens,
        action_mask=[1] * tokens,
        reward=reward,
        done=True,
        policy_version=0,
        call_ids=[f"{rid}-c{step}"],
    )


def batch() -> list[Transition]:
    """g1: returns 1, 0, 0.5 (r1 has two steps); g2: 2, 2 (no variance); g3: 0, 3."""
    return [
        tr("r1", "g1", 1.0, 0),
        tr("r1", "g1", 1.0, 1),
        tr("r2", "g1", 0.0),
        tr("r3", "g1", 0.5),
        tr("r4", "g2", 2.0),
        tr("r5", "g2", 2.0),
        tr("r6", "g3", 0.0),
        tr("r7", "g3", 3.0),
    ]


S3 = 3 / math.sqrt(2)  # sample std of (0, 3)
KEEP = [True, True, True, True, False, False, True, True]


def test_grpo_matches_hand_computed_example() -> None:
    adv, keep, stats = compute_advantages(batch(), None, GRPOConfig(std_eps=1e-6))
    # g1: mean .5, sample std .5 -> (1, 1, -1, 0); g2 skipped; g3: mean 1.5 -> -/+ 1.5/S3
    expected = [1.0, 1.0, -1.0, 0.0, 0.0, 0.0, -1.5 / S3, 1.5 / S3]
    assert_close(adv, torch.tensor(expected), rtol=0, atol=1e-5)
    assert keep.tolist() == KEEP
    assert stats == {
        "rollouts": 7.0,
        "groups": 3.0,
        "skipped_groups": 1.0,
        "skipped_rollouts": 2.0,
        "kept_transitions": 6.0,
        "return_mean": pytest.approx(8.5 / 7),
        "return_std": pytest.approx(
            math.sqrt(sum((v - 8.5 / 7) ** 2 for v in [1, 0, 0.5, 2, 2, 0, 3]) / 7)
        ),
    }


def test_grpo_without_std_scaling_and_without_skipping() -> None:
    cfg = GRPOConfig(scale_by_std=False, skip_zero_variance=False)
    adv, keep, stats = compute_advantages(batch(), None, cfg)
    assert_close(adv, torch.tensor([0.5, 0.5, -0.5, 0.0, 0.0, 0.0, -1.5, 1.5]))
    assert keep.all() and stats["skipped_groups"] == 0.0


def test_rloo_leave_one_out_baseline() -> None:
    adv, keep, stats = compute_advantages(batch(), None, RLOOConfig())
    # g1 baselines: (0+.5)/2, (1+.5)/2, (1+0)/2; g3: 3, 0
    assert_close(adv, torch.tensor([0.75, 0.75, -0.75, 0.0, 0.0, 0.0, -3.0, 3.0]))
    assert keep.tolist() == KEEP and stats["skipped_groups"] == 1.0


def test_reinforce_batch_running_and_no_baseline() -> None:
    mean = 8.5 / 7
    returns = [1.0, 1.0, 0.0, 0.5, 2.0, 2.0, 0.0, 3.0]
    adv, keep, stats = compute_advantages(batch(), None, ReinforceConfig())
    assert_close(adv, torch.tensor([r - mean for r in returns]))
    assert keep.all() and stats["skipped_groups"] == 0.0 and stats["baseline"] == mean

    adv, keep, stats = compute_advantages(batch(), None, ReinforceConfig(skip_zero_variance=True))
    assert keep.tolist() == KEEP and stats["skipped_rollouts"] == 2.0
    assert adv[4].item() == 0.0 and adv[0].item() == pytest.approx(1 - mean)

    adv, _, _ = compute_advantages(batch(), None, ReinforceConfig(baseline="none"))
    assert_close(adv, torch.tensor(returns))

    cfg = ReinforceConfig(baseline="running", baseline_momentum=0.5)
    state = RunningBaseline()
    adv, _, stats = compute_advantages(batch(), None, cfg, running=state)
    assert stats["baseline"] == pytest.approx(mean) and state.value == pytest.approx(mean)
    shifted = [tr(t.rollout_id, t.group, t.reward + 1.0, t.step) for t in batch()]
    adv, _, stats = compute_advantages(shifted, None, cfg, running=state)
    # uses the value from before this batch, then moves halfway to the new mean
    assert stats["baseline"] == pytest.approx(mean)
    assert_close(adv, torch.tensor([r + 1.0 - mean for r in returns]))
    assert state.value == pytest.approx(mean + 0.5)
    with pytest.raises(InvalidInput, match=r"running: reinforce\.baseline='running'"):
        compute_advantages(batch(), None, cfg)


def test_discounted_credit_uses_group_baseline_on_each_return_to_go() -> None:
    # discounted credit: a rollout's first transition carries its return G0
    ts = [
        tr("a", "g", 2.0, 0),
        tr("a", "g", 1.0, 1),
        tr("b", "g", 0.0, 0),
        tr("b", "g", 0.5, 1),
    ]
    adv, _, _ = compute_advantages(ts, None, GRPOConfig(scale_by_std=False))
    assert_close(adv, torch.tensor([1.0, 0.0, -1.0, -0.5]))  # baseline mean(G0) = 1
    # explicit returns override, and a transition-less rollout counts via `groups`
    adv, _, stats = compute_advantages(
        ts, {"a": 2.0, "b": 0.0, "c": 4.0}, GRPOConfig(scale_by_std=False), groups={"c": "g"}
    )
    assert_close(adv, torch.tensor([0.0, -1.0, -2.0, -1.5]))  # baseline 2
    assert stats["rollouts"] == 3.0 and stats["kept_transitions"] == 4.0


def test_advantage_input_errors() -> None:
    with pytest.raises(
        InvalidInput, match=r"rewards_by_rollout: no return for rollout\(s\) \['r1'"
    ):
        compute_advantages(batch(), {"r2": 1.0}, GRPOConfig())
    with pytest.raises(InvalidInput, match="rollout zz has no transitions"):
        compute_advantages(batch()[:1], {"r1": 1.0, "zz": 0.0}, GRPOConfig())
    adv, keep, stats = compute_advantages([], None, GRPOConfig())
    assert adv.shape == (0,) and keep.shape == (0,) and stats["rollouts"] == 0.0


# --- loss ------------------------------------------------------------------------------


def lp(*rows: list[float]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


def test_on_policy_loss_and_gradient_with_per_rollout_normalization() -> None:
    # rollout 0: one row of 4 tokens; rollout 1: one row of 1 token (rest padding)
    old = lp([-1.0, -1.0, -1.0, -1.0], [-2.0, 0.0, 0.0, 0.0])
    new = old.clone().requires_grad_(True)
    mask = lp([1, 1, 1, 1], [1, 0, 0, 0])
    adv = torch.tensor([1.0, -2.0])
    idx = torch.tensor([0, 1])
    loss, m = policy_loss(new, old, adv, mask, idx, GRPOConfig())
    # ratio 1: per-token loss -A; rollout means -1 and 2; mean over rollouts 0.5
    assert loss.item() == pytest.approx(0.5)
    (grad,) = torch.autograd.grad(loss, new)
    assert_close(grad, lp([-1 / 8] * 4, [1.0, 0.0, 0.0, 0.0]))
    assert m == {
        "clip_frac": 0.0,
        "approx_kl": 0.0,
        "logprob_mismatch": 0.0,
        "ratio_max": 1.0,
        "tokens": 5.0,
    }
    # token normalization: every token weighs 1/5
    loss, _ = policy_loss(new, old, adv, mask, idx, GRPOConfig(loss_normalization="token"))
    assert loss.item() == pytest.approx((4 * -1.0 + 2.0) / 5)


def test_long_and_short_rollouts_contribute_equally() -> None:
    # rollout 0 spans 3 rows of 6 tokens, rollout 1 one row of 2 tokens; same |advantage|
    old = torch.zeros(4, 6)
    new = torch.zeros(4, 6)
    mask = torch.ones(4, 6)
    mask[3, 2:] = 0
    adv = torch.tensor([1.0, 1.0, 1.0, -1.0])
    idx = torch.tensor([0, 0, 0, 1])
    loss, _ = policy_loss(new, old, adv, mask, idx, RLOOConfig())
    assert loss.item() == pytest.approx(0.0, abs=1e-6)  # (-1 + 1) / 2
    token_cfg = RLOOConfig(loss_normalization="token")
    loss, _ = policy_loss(new, old, adv, mask, idx, token_cfg)
    assert loss.item() == pytest.approx((18 * -1.0 + 2 * 1.0) / 20)  # dominated by rollout 0
    w = token_weights(mask, idx)
    assert w[:3].sum().item() == pytest.approx(0.5) and w[3].sum().item() == pytest.approx(0.5)


def test_clipping() -> None:
    cfg = GRPOConfig(clip_eps_low=0.2, clip_eps_high=0.3)
    old = torch.zeros(1, 4)
    # ratios 1.5, 0.5, 1.5, 0.5 with advantages +, +, -, - (one token per case)
    new = torch.log(torch.tensor([[1.5, 0.5, 1.5, 0.5]])).requires_grad_(True)
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    loss, m = policy_loss(new, old, adv, torch.ones(1, 4), torch.tensor([0]), cfg)
    # A>0, r=1.5: clipped to 1.3 (no grad); A>0, r=.5: unclipped -.5 (pessimistic);
    # A<0, r=1.5: unclipped 1.5; A<0, r=.5: clipped to .8 (no grad)
    assert loss.item() == pytest.approx((-1.3 - 0.5 + 1.5 + 0.8) / 4)
    (grad,) = torch.autograd.grad(loss, new)
    assert_close(grad, torch.tensor([[0.0, -0.5 / 4, 1.5 / 4, 0.0]]))
    assert m["clip_frac"] == 0.5 and m["ratio_max"] == pytest.approx(1.5)
    assert m["logprob_mismatch"] == pytest.approx(2 * (math.log(1.5) + math.log(2)) / 4)
    k3 = [r - 1 - math.log(r) for r in (1.5, 0.5, 1.5, 0.5)]
    assert m["approx_kl"] == pytest.approx(sum(k3) / 4)


def test_mask_is_respected() -> None:
    old = lp([-1.0, 0.0, -1.0])
    mask = lp([1, 0, 1])
    new_a = lp([-0.9, -50.0, -1.2]).requires_grad_(True)
    new_b = lp([-0.9, 80.0, -1.2]).requires_grad_(True)  # garbage where masked
    args = (torch.tensor([1.0]), mask, torch.tensor([0]), GRPOConfig())
    loss_a, m_a = policy_loss(new_a, old, *args)
    loss_b, m_b = policy_loss(new_b, old, *args)
    assert loss_a.item() == loss_b.item() and m_a == m_b and m_a["tokens"] == 2.0
    (grad,) = torch.autograd.grad(loss_b, new_b)
    assert torch.isfinite(grad).all() and grad[0, 1].item() == 0.0


def test_microbatches_sum_to_the_full_batch_loss() -> None:
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(5, 7, generator=g)
    new = old + 0.3 * torch.randn(5, 7, generator=g)
    mask = (torch.rand(5, 7, generator=g) > 0.3).float()
    adv = torch.randn(5, generator=g)
    idx = torch.tensor([0, 0, 1, 2, 2])
    cfg = GRPOConfig()
    full, _ = policy_loss(new, old, adv, mask, idx, cfg)
    totals = torch.zeros(3).index_add_(0, idx, mask.sum(1))
    parts = [
        policy_loss(new[r], old[r], adv[r], mask[r], idx[r], cfg, rollout_tokens=totals)[0]
        for r in ([0, 2], [1, 3, 4])
    ]
    assert_close(parts[0] + parts[1], full)


def test_kl_penalty_k3() -> None:
    old = torch.zeros(1, 2)
    new = torch.zeros(1, 2)
    ref = torch.log(torch.tensor([[0.5, 2.0]]))
    cfg = GRPOConfig(kl_coef=0.1)
    loss, m = policy_loss(
        new, old, torch.tensor([0.0]), torch.ones(1, 2), torch.tensor([0]), cfg, ref
    )
    k3 = [0.5 - 1 - math.log(0.5), 2.0 - 1 - math.log(2.0)]
    assert loss.item() == pytest.approx(0.1 * sum(k3) / 2)
    assert m["kl_ref"] == pytest.approx(sum(k3) / 2)
    with pytest.raises(InvalidInput, match=r"ref_logprobs: grpo\.kl_coef=0\.1 needs"):
        policy_loss(new, old, torch.tensor([0.0]), torch.ones(1, 2), torch.tensor([0]), cfg)


def test_entropy_metric_and_shape_errors() -> None:
    z = torch.zeros(1, 2)
    one = torch.tensor([1.0])
    _, m = policy_loss(
        z, z, one, torch.ones(1, 2), torch.tensor([0]), RLOOConfig(), entropy=torch.ones(1, 2)
    )
    assert m["entropy"] == 1.0
    with pytest.raises(InvalidInput, match=r"old_logprobs: shape \(1, 3\)"):
        policy_loss(z, torch.zeros(1, 3), one, torch.ones(1, 2), torch.tensor([0]), RLOOConfig())
    with pytest.raises(InvalidInput, match="advantages: shape"):
        policy_loss(z, z, torch.ones(3), torch.ones(1, 2), torch.tensor([0]), RLOOConfig())
    with pytest.raises(InvalidInput, match="rollout_index: shape"):
        policy_loss(z, z, one, torch.ones(1, 2), torch.tensor([0, 1]), RLOOConfig())


# --- configs -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cls", "kwargs", "field"),
    [
        (GRPOConfig, {"clip_eps_low": 1.0}, "grpo.clip_eps_low"),
        (GRPOConfig, {"clip_eps_low": "0.2"}, "grpo.clip_eps_low"),
        (GRPOConfig, {"clip_eps_high": -0.1}, "grpo.clip_eps_high"),
        (GRPOConfig, {"kl_coef": float("nan")}, "grpo.kl_coef"),
        (GRPOConfig, {"std_eps": 0.0}, "grpo.std_eps"),
        (GRPOConfig, {"scale_by_std": 1}, "grpo.scale_by_std"),
        (RLOOConfig, {"loss_normalization": "sequence"}, "rloo.loss_normalization"),
        (RLOOConfig, {"skip_zero_variance": "no"}, "rloo.skip_zero_variance"),
        (ReinforceConfig, {"baseline": "ema"}, "reinforce.baseline"),
        (ReinforceConfig, {"baseline_momentum": 1.0}, "reinforce.baseline_momentum"),
        (ReinforceConfig, {"kl_coef": -1}, "reinforce.kl_coef"),
    ],
)
def test_config_validation_names_field_and_fix(
    cls: Any, kwargs: dict[str, Any], field: str
) -> None:
    with pytest.raises(InvalidInput, match=rf"^{field}: .*\(got .*\); \w"):
        cls(**kwargs)


def test_validate_catches_later_mutation() -> None:
    cfg = GRPOConfig()
    cfg.clip_eps_low = 2.0
    with pytest.raises(InvalidInput, match=r"grpo\.clip_eps_low"):
        compute_advantages(batch(), None, cfg)
    assert set(ALGORITHMS) == {"grpo", "rloo", "reinforce"}


def test_make_config_from_settings() -> None:
    assert make_config("rloo", {"kl_coef": 0.01}) == RLOOConfig(kl_coef=0.01)
    assert make_config("grpo") == GRPOConfig()
    with pytest.raises(InvalidInput, match=r"reinforce\.baselin: unknown setting; known: clip"):
        make_config("reinforce", {"baselin": "batch"})
    with pytest.raises(InvalidInput, match="algorithm: unknown 'ppo'; use one of grpo, rloo"):
        make_config("ppo")
    with pytest.raises(InvalidInput, match=r"grpo\.std_eps"):
        make_config("grpo", {"std_eps": -1})
