"""Transitions → verl's batch layout, against verl's documented tensor contract (the one
its agent loop produces): left-padded prompts, right-padded responses, masks, position
ids, ``uid`` groups, the reward on the last response token, advantages, and padding for
divisibility that is counted and carries no weight. Needs no verl (see
``test_verl_real.py`` for the same against a real install)."""

from __future__ import annotations

import pytest
import torch

from boltrl.errors import InvalidInput
from boltrl.records import Transition
from boltrl_trainer.algorithms import GRPOConfig, policy_loss
from boltrl_trainer.batching import index_rollouts
from boltrl_trainer.verl.convert import (
    metrics_from_verl,
    rollout_weights,
    token_ids,
    transitions_to_verl,
)

PAD = 0


def tr(
    rollout: str,
    state: list[int],
    action: list[int],
    *,
    mask: list[int] | None = None,
    reward: float = 1.0,
    group: str = "g0",
    step: int = 0,
) -> Transition:
    mask = mask if mask is not None else [1] * len(action)
    return Transition(
        rollout_id=rollout,
        task_id=group,
        group=group,
        step=step,
        agent=None,
        state=state,
        action=action,
        action_logprobs=[-0.25 * m for m in mask],
        action_mask=mask,
        reward=reward,
        done=True,
        policy_version=0,
        call_ids=[f"{rollout}-{step}"],
    )


def t(rows: list[list[float]], dtype: torch.dtype = torch.long) -> torch.Tensor:
    return torch.tensor(rows, dtype=dtype)


def test_layout_matches_verls_contract() -> None:
    items = [
        tr("r1", [11, 12, 13], [21, 22], reward=0.5, group="a"),
        # a prefix-merged step: the tool output (31, 32) is observed, not sampled
        tr("r2", [14], [23, 31, 32, 24], mask=[1, 0, 0, 1], reward=-1.0, group="b", step=1),
    ]
    vb = transitions_to_verl(items, [2.0, -3.0], pad_id=PAD, normalization="token")
    x = vb.tensors
    assert (vb.real_rows, vb.pad_rows, len(vb)) == (2, 0, 2)
    assert torch.equal(x["prompts"], t([[11, 12, 13], [PAD, PAD, 14]]))
    assert torch.equal(x["responses"], t([[21, 22, PAD, PAD], [23, 31, 32, 24]]))
    assert torch.equal(x["input_ids"], torch.cat([x["prompts"], x["responses"]], dim=1))
    assert torch.equal(x["attention_mask"], t([[1, 1, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1, 1]]))
    assert torch.equal(x["position_ids"], t([[0, 1, 2, 3, 4, 4, 4], [0, 0, 0, 1, 2, 3, 4]]))
    assert torch.equal(x["response_mask"], t([[1, 1, 0, 0], [1, 0, 0, 1]]))
    assert x["attention_mask"].dtype == x["response_mask"].dtype == torch.long
    lp = t([[-0.25, -0.25, 0, 0], [-0.25, 0, 0, -0.25]], torch.float32)
    assert torch.equal(x["rollout_log_probs"], lp)
    rewards = t([[0, 0.5, 0, 0], [0, 0, 0, -1.0]], torch.float32)  # on the last token
    assert torch.equal(x["token_level_scores"], rewards)
    assert torch.equal(x["token_level_rewards"], rewards)
    adv = t([[2, 2, 0, 0], [-3, 0, 0, -3]], torch.float32)  # on trained tokens only
    assert torch.equal(x["advantages"], adv)
    assert torch.equal(x["returns"], adv)
    assert torch.equal(x["advantage_scale"], t([1, 1], torch.float32))
    assert sorted(x) == sorted(
        [
            "prompts",
            "responses",
            "input_ids",
            "attention_mask",
            "position_ids",
            "response_mask",
            "rollout_log_probs",
            "token_level_scores",
            "token_level_rewards",
            "advantages",
            "returns",
            "advantage_scale",
        ]
    )
    nt = {k: v.tolist() for k, v in vb.non_tensors.items()}
    assert nt == {
        "uid": ["a", "b"],
        "rollout_id": ["r1", "r2"],
        "boltrl_step": [0, 1],
        "boltrl_pad": [False, False],
    }
    assert all(v.dtype == object for k, v in vb.non_tensors.items() if k != "boltrl_pad")
    assert vb.meta_info == {"temperature": 1.0, "boltrl_pad_rows": 0}


def test_token_ids_round_trip_exactly() -> None:
    items = [
        tr(f"r{i}", list(range(100 + i, 100 + 3 * i + 1)), list(range(7, 7 + i % 4 + 1)))
        for i in range(9)
    ]
    vb = transitions_to_verl(items, [0.1] * 9, pad_id=PAD, multiple=4)
    assert token_ids(vb)[:9] == [(x.state, x.action) for x in items]
    assert token_ids(vb.tensors) == token_ids(vb)


def test_padding_for_divisibility_is_counted_and_weightless() -> None:
    items = [tr(f"r{i}", [5, 6, 7][: i + 1], [8, 9][: i % 2 + 1], reward=1.0) for i in range(5)]
    vb = transitions_to_verl(items, [1.0] * 5, pad_id=PAD, multiple=4)
    assert (vb.real_rows, vb.pad_rows, len(vb)) == (5, 3, 8)
    assert vb.meta_info["boltrl_pad_rows"] == 3
    x, pad = vb.tensors, slice(5, 8)
    # padding rows copy real rows (realistic lengths for load balancing, never empty)...
    assert torch.equal(x["input_ids"][pad], x["input_ids"][:3])
    assert torch.equal(x["attention_mask"][pad], x["attention_mask"][:3])
    # ...but weigh nothing: no trained tokens, advantage, reward or scale
    for key in ("response_mask", "advantages", "returns", "token_level_scores"):
        assert not x[key][pad].any(), key
    assert not x["advantage_scale"][pad].any()
    nt = vb.non_tensors
    assert nt["boltrl_pad"].tolist() == [False] * 5 + [True] * 3
    assert nt["uid"].tolist()[5:] == ["__boltrl_pad__0", "__boltrl_pad__1", "__boltrl_pad__2"]
    assert transitions_to_verl(items[:4], None, pad_id=PAD, multiple=4).pad_rows == 0


def test_without_advantages_verl_gets_rewards_to_estimate_from() -> None:
    vb = transitions_to_verl([tr("r", [1], [2, 3], reward=0.75)], None, pad_id=PAD)
    assert "advantages" not in vb.tensors and "returns" not in vb.tensors
    assert vb.tensors["token_level_rewards"].tolist() == [[0.0, 0.75]]


def test_fixed_widths_pad_further_and_never_truncate() -> None:
    vb = transitions_to_verl(
        [tr("r", [1, 2], [3])], [1.0], pad_id=9, prompt_width=4, response_width=3
    )
    assert vb.tensors["input_ids"].tolist() == [[9, 9, 1, 2, 3, 9, 9]]
    with pytest.raises(InvalidInput, match="exceed the fixed widths 1/1"):
        transitions_to_verl([tr("r", [1, 2], [3])], [1.0], pad_id=9, prompt_width=1)


def test_rollout_weights_make_token_mean_a_rollout_mean() -> None:
    # rollout a: 2 steps with 3 + 1 trained tokens; rollout b: 1 step with 2 (1 masked)
    items = [
        tr("a", [1], [2, 3, 4]),
        tr("a", [1], [5], step=1),
        tr("b", [1], [6, 7, 8], mask=[1, 0, 1]),
    ]
    # N = 6 trained tokens, K = 2 rollouts: a's tokens weigh 6/(2*4), b's 6/(2*2)
    assert rollout_weights(items) == [0.75, 0.75, 1.5]
    assert rollout_weights(items, "token") == [1.0, 1.0, 1.0]
    adv = [1.0, -0.5, 2.0]
    vb = transitions_to_verl(items, adv, pad_id=PAD, multiple=2)
    mask = vb.tensors["response_mask"].float()
    gen = torch.Generator().manual_seed(0)
    old = vb.tensors["rollout_log_probs"]
    new = old + 0.3 * torch.randn(old.shape, generator=gen)
    rows, tokens = index_rollouts(items)
    idx = torch.tensor([*rows, 0])  # the padding row has no tokens: any rollout
    # verl's token-mean (= boltrl's "token" normalization) on the scaled advantages...
    token_mean, _ = policy_loss(
        new, old, vb.tensors["advantages"], mask, idx, GRPOConfig(loss_normalization="token")
    )
    # ...is boltrl's rollout-normalized loss on the plain ones
    rollout_mean, _ = policy_loss(
        new[:3],
        old[:3],
        torch.tensor(adv),
        mask[:3],
        torch.tensor(rows),
        GRPOConfig(),
        rollout_tokens=torch.tensor(tokens, dtype=torch.float32),
    )
    assert torch.allclose(token_mean, rollout_mean, rtol=1e-6)


@pytest.mark.parametrize(
    ("items", "adv", "message"),
    [
        ([], None, "the batch is empty"),
        ([tr("r", [], [1])], None, r"transitions\[0\] \(rollout r, step 0\): empty state"),
        ([tr("r", [1], [])], None, "empty action"),
        ([tr("r", [1], [2, 3], mask=[1])], None, "must have the same length"),
        ([tr("r", [1], [2])], [1.0, 2.0], "advantages: 2 values for 1 transitions"),
    ],
)
def test_bad_batches_are_refused_by_name(
    items: list[Transition], adv: list[float] | None, message: str
) -> None:
    with pytest.raises(InvalidInput, match=message):
        transitions_to_verl(items, adv, pad_id=PAD)


def test_metrics_from_verl_flatten_and_rename() -> None:
    got = metrics_from_verl(
        {
            "actor/pg_loss": [0.5, 1.5],
            "actor/pg_clipfrac": 0.25,
            "actor/ppo_kl": torch.tensor(0.01),
            "actor/grad_norm": 2.0,
            "actor/lr": [1e-6],
            "perf/mfu/actor": 0.3,
            "actor/note": "text",
            "actor/empty": [],
        }
    )
    assert got == pytest.approx(
        {
            "verl/actor/pg_loss": 1.0,
            "update/loss": 1.0,
            "verl/actor/pg_clipfrac": 0.25,
            "update/clip_frac": 0.25,
            "verl/actor/ppo_kl": 0.01,
            "update/approx_kl": 0.01,
            "verl/actor/grad_norm": 2.0,
            "update/grad_norm": 2.0,
            "verl/actor/lr": 1e-6,
            "update/lr": 1e-6,
            "verl/perf/mfu/actor": 0.3,
        }
    )
