"""The off-policy core: staleness bound, behaviour weights, decoupled PPO loss, and the
torch update's two paths (fresh: the on-policy loss bit for bit; stale: proximal
logprobs recomputed at the start of the update)."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
import torch

from boltrl.errors import InvalidInput
from boltrl.records import Transition
from boltrl_trainer.algorithms import make_config, policy_loss
from boltrl_trainer.batching import index_rollouts, pack_microbatches
from boltrl_trainer.config import LoraConfig, OptimConfig
from boltrl_trainer.models import load_model, tiny_model
from boltrl_trainer.offpolicy import behaviour_weights, select_fresh
from boltrl_trainer.policy import apply_lora
from boltrl_trainer.seams import TrainBatch
from boltrl_trainer.update import TorchTrainingBackend


def _t(rid: str, version: int | None, *, state: list[int] | None = None) -> Transition:
    return Transition(
        rollout_id=rid,
        task_id="t",
        group="t",
        step=0,
        agent=None,
        state=state or [1, 2, 3],
        action=[4, 5],
        action_logprobs=[-1.0, -1.0],
        action_mask=[1, 1],
        reward=0.0,
        done=True,
        policy_version=version,
        call_ids=[f"c-{rid}"],
    )


# --- staleness -------------------------------------------------------------------------


def test_select_fresh_drops_counts_and_histograms_by_staleness() -> None:
    batch = [_t("a", 5), _t("b", 4), _t("c", 3), _t("d", 2), _t("e", None), _t("f", 4)]
    kept, stats = select_fresh(batch, current_version=5, max_staleness=1)
    assert [t.rollout_id for t in kept] == ["a", "b", "e", "f"]  # order kept
    # None counts as current (staleness 0): its age is unknown, and it is counted apart
    assert stats.histogram == {0: 2, 1: 2, 2: 1, 3: 1}
    assert (stats.dropped, stats.unversioned, stats.kept) == (2, 1, 4)
    m = stats.metrics()
    assert m["offpolicy/dropped"] == 2.0 and m["offpolicy/kept"] == 4.0
    assert m["offpolicy/staleness_mean"] == pytest.approx(2 / 4)  # of the kept: 0,0,1,1
    assert m["offpolicy/staleness_max"] == 1.0
    assert (m["offpolicy/staleness_2"], m["offpolicy/staleness_3"]) == (1.0, 1.0)
    assert m["offpolicy/unversioned"] == 1.0


def test_select_fresh_without_a_bound_keeps_all_and_refuses_bad_input() -> None:
    kept, stats = select_fresh([_t("a", 0), _t("b", 3)], current_version=3, max_staleness=None)
    assert len(kept) == 2 and stats.dropped == 0 and stats.histogram == {3: 1, 0: 1}
    with pytest.raises(InvalidInput, match="newer than the current 3"):
        select_fresh([_t("a", 4)], current_version=3, max_staleness=1)
    with pytest.raises(InvalidInput, match="max_staleness"):
        select_fresh([_t("a", 3)], current_version=3, max_staleness=-1)
    kept, stats = select_fresh([_t("a", 1)], current_version=3, max_staleness=0)
    assert kept == [] and stats.dropped == 1


# --- the loss against a hand-computed case ------------------------------------------------


def test_decoupled_loss_and_weights_match_a_hand_computed_example() -> None:
    # One rollout, three action tokens, advantage +1, clip 0.2, is_cap 2:
    #   token  pi_b  pi_prox  pi_new   w = prox/b     r = new/prox  clipped r  term = -A*max..*w
    #   1      0.5   0.6      0.66     1.2            1.1           1.1        -1.1 * 1.2 = -1.32
    #   2      0.2   0.5      0.7      2.5 -> 2.0     1.4           1.2        -1.2 * 2.0 = -2.40
    #   3      0.4   0.4      0.2      1.0            0.5           0.8        -0.5 * 1.0 = -0.50
    # (token 3: max(-0.5, -0.8) = -0.5, the unclipped term; token 2: the clipped one.)
    # Rollout normalization averages the tokens: loss = (-1.32 - 2.40 - 0.50) / 3 = -1.40667.
    # Gradient w.r.t. logp_new: token 1 -A*r*w/3 = -0.44; token 2 clipped: 0; token 3 -0.5/3.
    b = torch.log(torch.tensor([[0.5, 0.2, 0.4]]))
    p = torch.log(torch.tensor([[0.6, 0.5, 0.4]]))
    new = torch.log(torch.tensor([[0.66, 0.7, 0.2]])).requires_grad_(True)
    mask = torch.ones(1, 3)
    cfg = make_config("grpo", {"is_cap": 2.0})
    loss, m = policy_loss(
        new, b, torch.tensor([1.0]), mask, torch.tensor([0]), cfg, prox_logprobs=p
    )
    assert loss.item() == pytest.approx(-4.22 / 3, abs=1e-6)
    loss.backward()  # type: ignore[no-untyped-call]
    assert new.grad is not None
    assert new.grad.tolist()[0] == pytest.approx([-0.44, 0.0, -0.5 / 3], abs=1e-6)
    # raw weights 1.2, 2.5, 1.0: mean 1.5667, population std 0.6600, max 2.5, 1 of 3 truncated
    raw = [1.2, 2.5, 1.0]
    mean = sum(raw) / 3
    std = math.sqrt(sum((w - mean) ** 2 for w in raw) / 3)
    assert m["is_weight_mean"] == pytest.approx(mean, abs=1e-6)
    assert m["is_weight_std"] == pytest.approx(std, abs=1e-6)
    assert m["is_weight_max"] == pytest.approx(2.5, abs=1e-6)
    assert m["truncated_frac"] == pytest.approx(1 / 3)
    bw = behaviour_weights(p, b, mask, 2.0)
    assert bw.weights.tolist()[0] == pytest.approx([1.2, 2.0, 1.0], abs=1e-6)


def test_weights_ignore_untrained_tokens_and_validate_the_cap() -> None:
    b = torch.tensor([[-1.0, -5.0]])
    p = torch.tensor([[-1.0, 0.0]])  # token 2 would weigh e^5 but is masked out
    bw = behaviour_weights(p, b, torch.tensor([[1.0, 0.0]]), 2.0)
    assert bw.weights.tolist() == [[1.0, 1.0]] and bw.metrics["truncated_frac"] == 0.0
    with pytest.raises(InvalidInput, match="is_cap"):
        behaviour_weights(p, b, torch.ones(1, 2), 0.5)
    with pytest.raises(InvalidInput, match=r"grpo\.is_cap"):
        make_config("grpo", {"is_cap": 0.9})


def test_fresh_samples_give_exactly_the_on_policy_loss() -> None:
    # prox = behaviour: w = exp(0) = 1 exactly, so the decoupled loss is the old one bit for bit
    torch.manual_seed(0)
    old = torch.randn(3, 5)
    new = (old + 0.3 * torch.randn(3, 5)).requires_grad_(True)
    mask = (torch.rand(3, 5) > 0.2).float()
    adv, idx = torch.tensor([1.0, -0.5, 2.0]), torch.tensor([0, 0, 1])
    cfg = make_config("grpo")
    a, ma = policy_loss(new, old, adv, mask, idx, cfg)
    b, mb = policy_loss(new, old, adv, mask, idx, cfg, prox_logprobs=old.clone())
    assert a.item() == b.item() and ma == {k: mb[k] for k in ma}
    assert mb["is_weight_mean"] == 1.0 and mb["truncated_frac"] == 0.0


# --- the torch update's two paths -------------------------------------------------------


@pytest.fixture(scope="module")
def tiny() -> Any:
    torch.manual_seed(0)
    model, tok = load_model(str(tiny_model()))
    model = apply_lora(model, LoraConfig(r=4, alpha=8))
    model.train(False)
    return model, tok


def _sampled(tb: TorchTrainingBackend, version: int, n: int = 4) -> list[Transition]:
    """Transitions whose behaviour logprobs are what ``tb``'s model gives right now."""
    g = torch.Generator().manual_seed(7)
    trans = []
    for i in range(n):
        state = torch.randint(5, 500, (4 + i,), generator=g).tolist()
        action = torch.randint(5, 500, (3,), generator=g).tolist()
        trans.append(
            _t(f"r{i}", version, state=state).model_copy(
                update={
                    "action": action,
                    "action_logprobs": [0.0] * 3,
                    "action_mask": [1, 1, 1],
                    "reward": float(i % 2),
                }
            )
        )
    x = tb._tensors(trans, [0.0] * n)
    with torch.no_grad():
        lp = tb._logprobs(x, 1.0)
    return [
        t.model_copy(update={"action_logprobs": lp[i, :3].tolist()}) for i, t in enumerate(trans)
    ]


def _reference_step(
    tb: TorchTrainingBackend, batch: TrainBatch, prox: torch.Tensor | None
) -> dict[str, torch.Tensor]:
    """The update written out by hand: one micro-batch, policy_loss, clip, AdamW step."""
    rows, tokens = index_rollouts(batch.transitions)
    (mb,) = pack_microbatches(batch.transitions, tb.optim_cfg.token_budget)  # the row order
    x = tb._tensors([batch.transitions[i] for i in mb], [batch.advantages[i] for i in mb])
    tb.model.train()
    tb.optimizer.zero_grad(set_to_none=True)
    new = tb._logprobs(x, batch.temperature)
    loss, _ = policy_loss(
        new,
        x["old"],
        x["adv"],
        x["mask"],
        torch.tensor([rows[i] for i in mb]),
        tb.algo,
        rollout_tokens=torch.tensor(tokens, dtype=torch.float32),
        prox_logprobs=None if prox is None else prox[mb],
    )
    loss.backward()  # type: ignore[no-untyped-call]
    torch.nn.utils.clip_grad_norm_(tb.params, tb.optim_cfg.grad_clip)
    tb.optimizer.step()
    tb.model.eval()
    return {n: p.detach().clone() for n, p in tb.model.named_parameters() if p.requires_grad}


def _trainable(model: Any) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def _pair(tiny: Any, version: int) -> tuple[TorchTrainingBackend, TorchTrainingBackend]:
    model, _tok = tiny
    optim = OptimConfig(lr=0.05)
    a = TorchTrainingBackend(
        copy.deepcopy(model), make_config("grpo"), optim, pad_id=0, version=version
    )
    b = TorchTrainingBackend(
        copy.deepcopy(model), make_config("grpo"), optim, pad_id=0, version=version
    )
    return a, b


def test_a_fresh_batch_takes_the_on_policy_path_bit_for_bit(tiny: Any) -> None:
    a, b = _pair(tiny, version=3)
    trans = _sampled(a, version=3)
    batch = TrainBatch(trans, [1.0, -1.0, 0.5, -0.5], 3, 1.0)
    m = a.update(batch)
    expected = _reference_step(b, batch, prox=None)  # the loss as it was before off-policy
    got = _trainable(a.model)
    assert all(torch.equal(got[k], expected[k]) for k in expected)
    assert "time/proximal_s" not in m and "offpolicy/is_weight_mean" not in m
    assert m["offpolicy/stale_frac"] == 0.0


def test_a_stale_batch_recomputes_proximal_logprobs_before_the_step(tiny: Any) -> None:
    a, b = _pair(tiny, version=0)
    trans = _sampled(a, version=0)  # behaviour: the version-0 weights
    step0 = TrainBatch(trans, [1.0, -1.0, 1.0, -1.0], 0, 1.0)
    a.update(step0)
    _reference_step(b, step0, prox=None)  # both now at version 1, equal weights
    b._version = 1
    assert all(torch.equal(_trainable(a.model)[k], v) for k, v in _trainable(b.model).items())
    # train version 1 on the version-0 samples: staleness 1 for rows 0-1, fresh rows 2-3
    mixed = [trans[0], trans[1]] + [
        t.model_copy(update={"policy_version": 1}) for t in _sampled(a, 1)[2:]
    ]
    batch = TrainBatch(mixed, [1.0, -1.0, 1.0, -1.0], 1, 1.0)
    x = b._tensors(mixed, batch.advantages)
    with torch.no_grad():
        recomputed = b._logprobs(x, 1.0)
    prox = a._proximal(x, [True, True, False, False], batch, None)  # a separate pass
    assert torch.equal(prox[:2], recomputed[:2])  # stale rows: the weights before the step
    assert torch.equal(prox[2:], x["old"][2:])  # fresh rows: behaviour as proximal
    m = a.update(batch)
    expected = _reference_step(b, batch, prox=prox)
    got = _trainable(a.model)
    assert all(torch.allclose(got[k], expected[k], atol=1e-7) for k in expected)
    # no dropout: epoch 0's own forward gave the proximal logprobs, no extra pass
    assert m["offpolicy/stale_frac"] == 0.5 and m["update/proximal_passes"] == 0
    # the policy moved at step 0 (lr 0.05), so the stale rows' weights are not all 1
    assert m["offpolicy/is_weight_std"] > 1e-4
    assert 0.0 <= m["offpolicy/truncated_frac"] <= 1.0
    assert a.policy_version == 2


def test_with_dropout_the_proximal_logprobs_take_a_separate_eval_pass() -> None:
    # a noisy training forward cannot stand for the proximal policy: one no-grad pass in
    # eval mode per stale micro-batch, giving the dropout-free logprobs
    torch.manual_seed(0)
    model, _ = load_model(str(tiny_model()))
    model = apply_lora(model, LoraConfig(r=4, alpha=8, dropout=0.3))
    model.train(False)
    tb = TorchTrainingBackend(model, make_config("grpo"), OptimConfig(), pad_id=0, version=1)
    trans = _sampled(tb, version=0)
    batch = TrainBatch(trans, [1.0, -1.0, 1.0, -1.0], 1, 1.0)
    x = tb._tensors(trans, batch.advantages)
    with torch.no_grad():
        clean = tb._logprobs(x, 1.0)
    tb.model.train()
    assert torch.equal(tb._proximal(x, [True] * 4, batch, None), clean)
    assert tb.model.training  # the pass restores the mode it found
    m = tb.update(batch)
    assert m["update/proximal_passes"] == 1.0 and m["offpolicy/stale_frac"] == 1.0
