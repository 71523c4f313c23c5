"""The update's two-pass forward (each distinct state once) computes the plain forward's
logprobs and gradients, matches what the gateway recorded, and packs whole groups."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

from boltrl.gateway.backend import GenerationRequest
from boltrl.records import Transition
from boltrl_trainer import _shared_prompt
from boltrl_trainer.algorithms import make_config
from boltrl_trainer.batching import pack_shared_microbatches, shared_cost
from boltrl_trainer.config import LoraConfig, OptimConfig
from boltrl_trainer.models import load_model, tiny_model
from boltrl_trainer.policy import apply_lora
from boltrl_trainer.seams import TrainBatch
from boltrl_trainer.serving import TransformersBackend
from boltrl_trainer.update import TorchTrainingBackend


@pytest.fixture(scope="module")
def loaded() -> Any:
    torch.manual_seed(0)
    model, tok = load_model(str(tiny_model()))
    model = apply_lora(model, LoraConfig(r=4, alpha=8))
    model.train(False)
    return model, tok


def _t(i: int, state: list[int], action: list[int], logprobs: list[float] | None = None) -> Any:
    return Transition(
        rollout_id=f"r{i}",
        task_id="t",
        group="g",
        step=0,
        agent=None,
        state=state,
        action=action,
        action_logprobs=logprobs or [0.0] * len(action),
        action_mask=[1] * len(action),
        reward=float(i % 2),
        done=True,
        policy_version=0,
        call_ids=[f"c{i}"],
    )


def _groups(seed: int = 0) -> list[Transition]:
    """Three states of different lengths, 1-4 rows each, actions of 1-7 tokens."""
    rng = random.Random(seed)
    out: list[Transition] = []
    for n_state, n_rows in ((9, 4), (5, 3), (12, 1)):
        state = [rng.randrange(5, 400) for _ in range(n_state)]
        for _ in range(n_rows):
            out.append(
                _t(len(out), state, [rng.randrange(5, 400) for _ in range(rng.randint(1, 7))])
            )
    return out


def _family(seed: int = 0) -> list[Transition]:
    """Four distinct states that share a 40-token beginning (an agent's system prompt and
    tools), one of them sampled three times, actions of 1-6 tokens."""
    rng = random.Random(seed)
    common = [rng.randrange(5, 400) for _ in range(40)]
    out: list[Transition] = []
    for first, n_rest, n_rows in ((401, 3, 3), (402, 8, 1), (403, 1, 2), (404, 5, 1)):
        state = common + [first] + [rng.randrange(5, 400) for _ in range(n_rest - 1)]
        for _ in range(n_rows):
            out.append(
                _t(len(out), state, [rng.randrange(5, 400) for _ in range(rng.randint(1, 6))])
            )
    return out


def _backend(model: Any, tok: Any) -> TorchTrainingBackend:
    return TorchTrainingBackend(model, make_config("grpo"), OptimConfig(), pad_id=tok.pad_token_id)


@pytest.mark.parametrize(("family", "common"), [(_groups, 0), (_family, 40)])
def test_two_passes_equal_the_plain_forward_with_gradients(
    loaded: Any, family: Any, common: int
) -> None:
    """Each distinct state once (and, for states that share a long beginning, that
    beginning once first): the plain forward's logprobs and gradients."""
    model, tok = loaded
    assert _shared_prompt.usable(model)
    tb = _backend(model, tok)
    items = family()
    assert tb._tensors(items, [0.0] * len(items), shared=True)["shared"].common_ids.shape == (
        1,
        common,
    )
    adv = [0.0] * len(items)
    grads = []
    values = []
    for shared in (False, True):
        x = tb._tensors(items, adv, shared=shared)
        model.zero_grad(set_to_none=True)
        new = tb._logprobs(x, 0.7)
        (new * x["mask"] * torch.linspace(-1, 1, new.numel()).view_as(new)).sum().backward()
        values.append((new * x["mask"]).detach())
        grads.append([p.grad.clone() for p in tb.params])
    assert torch.allclose(values[0], values[1], atol=1e-5), (values[0] - values[1]).abs().max()
    for g0, g1 in zip(*grads, strict=True):
        assert torch.allclose(g0, g1, atol=1e-5, rtol=1e-4), (g0 - g1).abs().max()
    model.zero_grad(set_to_none=True)


def test_single_token_actions_take_only_the_first_pass(loaded: Any) -> None:
    model, tok = loaded
    tb = _backend(model, tok)
    items = [_t(i, [11, 12, 13, 14], [20 + i]) for i in range(3)]
    plain = tb._logprobs(tb._tensors(items, [0.0] * 3), 1.0)
    shared = tb._tensors(items, [0.0] * 3, shared=True)
    assert shared["shared"].suffix_ids.shape == (3, 0)
    assert torch.allclose(plain, tb._logprobs(shared, 1.0), atol=1e-5)


def test_shared_forward_recomputes_the_recorded_logprobs(loaded: Any) -> None:
    """GRPO-style: 4 samples of each of 2 prompts through the real server."""
    model, tok = loaded
    backend = TransformersBackend(model, tok, max_batch=8, seed=3)
    try:
        futs = [
            backend.submit(
                GenerationRequest(
                    messages=[{"role": "user", "content": p}], temperature=0.7, max_tokens=6
                )
            )
            for p in ["hi there", "a longer prompt than that"] * 4
        ]
        gens = [f.result(60) for f in futs]
    finally:
        backend.close()
    items = [
        _t(i, g.prompt_token_ids, g.response_token_ids, g.response_logprobs)
        for i, g in enumerate(gens)
    ]
    tb = _backend(model, tok)
    x = tb._tensors(items, [0.0] * len(items), shared=True)
    assert x["shared"].prefix_ids.shape[0] == 2  # two distinct prompts computed
    with torch.no_grad():
        new = tb._logprobs(x, 0.7)
    assert torch.allclose(new * x["mask"], x["old"], atol=1e-4), (
        (new * x["mask"] - x["old"]).abs().max()
    )


def test_update_takes_the_shared_path_only_when_states_repeat(loaded: Any) -> None:
    model, tok = loaded
    snapshot = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    try:
        tb = _backend(model, tok)
        items = _groups()
        adv = [1.0 if i % 2 else -1.0 for i in range(len(items))]
        m = tb.update(TrainBatch(items, adv, policy_version=0, temperature=1.0))
        assert m["update/shared_states"] == 1.0
        unique = [_t(i, [30 + i, 31, 32], [40, 41]) for i in range(4)]
        m = tb.update(TrainBatch(unique, [1.0, -1.0, 1.0, -1.0], policy_version=0, temperature=1.0))
        assert m["update/shared_states"] == 0.0
        # distinct states that share a long beginning: it is computed once
        opening = list(range(100, 140))
        calls = [_t(i, [*opening, 30 + i, 31, 32], [40, 41]) for i in range(4)]
        m = tb.update(TrainBatch(calls, [1.0, -1.0, 1.0, -1.0], policy_version=0, temperature=1.0))
        assert m["update/shared_states"] == 1.0
    finally:
        with torch.no_grad():
            for n, p in model.named_parameters():
                if n in snapshot:
                    p.copy_(snapshot[n])


def _one_update(
    loaded: Any, items: list[Transition], adv: list[float], share: bool
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, float]]:
    """The trainable weights before and after one update on ``items``, and its metrics;
    the model's weights are put back afterwards."""
    model, tok = loaded
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    try:
        tb = _backend(model, tok)
        tb._share_states = share
        m = tb.update(TrainBatch(items, adv, policy_version=0, temperature=1.0))
        after = {n: p.detach().clone() for n, p in model.named_parameters() if n in before}
    finally:
        with torch.no_grad():
            for n, p in model.named_parameters():
                if n in before:
                    p.copy_(before[n])
    return before, after, m


@pytest.mark.parametrize("family", [_groups, _family])
def test_shared_update_equals_the_plain_update(loaded: Any, family: Any) -> None:
    """One optimizer step either way moves the weights to the same place."""
    items = family(1)
    adv = [1.0 if i % 3 else -0.5 for i in range(len(items))]
    _, plain, _ = _one_update(loaded, items, adv, share=False)
    _, shared, _ = _one_update(loaded, items, adv, share=True)
    for n in plain:
        assert torch.allclose(plain[n], shared[n], atol=1e-6), n


def test_packing_keeps_groups_together_and_counts_each_state_once() -> None:
    items = [_t(i, [1] * 40, [2] * (1 + i % 16)) for i in range(8)]
    items += [_t(8 + i, [3] * 45, [2] * (1 + i % 9)) for i in range(8)]
    items += [_t(16 + i, [4] * 30, [2] * 16) for i in range(8)]
    batches = pack_shared_microbatches(items, 512)
    assert sorted(i for b in batches for i in b) == list(range(24))
    for b in batches:
        states = {tuple(items[i].state) for i in b}
        cost = len(states) * max(len(s) for s in states)
        cost += len(b) * max(len(items[i].action) for i in b)
        assert cost <= 512
    # 45 + 8 * 9 = 117, then + 40 + 16 * 16 ... each group whole: no group split
    owner = {i: k for k, b in enumerate(batches) for i in b}
    for g in range(3):
        assert len({owner[i] for i in range(8 * g, 8 * g + 8)}) == 1
    # a row longer than the budget alone
    big = [_t(0, [1] * 600, [2] * 3), _t(1, [1] * 600, [2] * 3)]
    assert pack_shared_microbatches(big, 512) == [[0], [1]]
    with pytest.raises(ValueError, match="max_tokens"):
        pack_shared_microbatches(items, 0)


def test_packing_counts_a_shared_beginning_once() -> None:
    """States that share a long beginning pack by ``shared + states * rest + rows *
    action``: more of them fit a budget than whole states would, and the packing never
    costs more than with the beginning counted in every state."""
    opening = [7] * 200
    items = [_t(i, [*opening, 1000 + i, 5, 6], [2] * 4) for i in range(12)]  # distinct
    batches = pack_shared_microbatches(items, 512)
    assert sorted(i for b in batches for i in b) == list(range(12))
    assert batches == [list(range(12))]  # 200 + 12 * 3 + 12 * 4 = 284 <= 512
    assert shared_cost(items, batches[0]) == 200 + 12 * (203 - 200) + 12 * 4
    # without the beginning counted once, 12 states of 203 tokens need 5+ micro-batches
    assert len(pack_shared_microbatches(items, 512, min_shared=10_000)) >= 5


def _two_call_rollouts(seed: int = 0) -> tuple[list[Transition], list[Transition]]:
    """A group of 4 agent rollouts of two calls each (a tool call, then the answer after
    the tool's result), as two transitions per rollout and as one merged transition
    (``credit.merge_prefix``: the second call's prompt is the first call's prompt, reply
    and the tool's result, which is context, not a target)."""
    rng = random.Random(seed)
    opening = [rng.randrange(5, 400) for _ in range(40)]  # system prompt, tools, question
    separate: list[Transition] = []
    merged: list[Transition] = []
    for i in range(4):
        call1 = [rng.randrange(5, 400) for _ in range(rng.randint(2, 6))]
        result = [rng.randrange(5, 400) for _ in range(rng.randint(3, 8))]
        call2 = [rng.randrange(5, 400) for _ in range(rng.randint(1, 4))]
        lp1 = [-rng.random() for _ in call1]
        lp2 = [-rng.random() for _ in call2]
        first = _t(i, opening, call1, lp1)
        second = _t(i, opening + call1 + result, call2, lp2)
        separate += [first, second]
        merged.append(
            first.model_copy(
                update={
                    "action": call1 + result + call2,
                    "action_logprobs": lp1 + [0.0] * len(result) + lp2,
                    "action_mask": [1] * len(call1) + [0] * len(result) + [1] * len(call2),
                }
            )
        )
    return separate, merged


@pytest.mark.parametrize("share", [False, True])
def test_merged_calls_update_like_their_separate_calls(loaded: Any, share: bool) -> None:
    """``credit.merge_prefix`` is a speed choice for the update, not a different loss: the
    loss averages tokens per rollout, so a rollout's calls merged into one sequence move
    the weights where its separate transitions do (with final credit both carry the
    rollout's advantage), while the forward computes the shared context once."""
    separate, merged = _two_call_rollouts()
    adv = {f"r{i}": a for i, a in enumerate((1.0, -1.0, 0.5, -0.5))}
    trained = sum(sum(t.action_mask) for t in separate)
    after = []
    for items in (separate, merged):
        before, moved_to, m = _one_update(loaded, items, [adv[t.rollout_id] for t in items], share)
        assert m["update/tokens"] == trained
        after.append(moved_to)
    moved = max((after[0][n] - before[n]).abs().max().item() for n in before)
    assert moved > 1e-5  # the step did move the weights
    for n in before:
        assert torch.allclose(after[0][n], after[1][n], atol=1e-6), n
