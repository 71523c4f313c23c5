"""Micro-batch packing, rollout indexing and log-probs / entropy from logits."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from boltrl.errors import InvalidInput
from boltrl.records import Transition
from boltrl_trainer.batching import (
    entropy_from_logits,
    index_rollouts,
    pack_microbatches,
    pack_prefix_microbatches,
    shared_prefix,
    token_logprobs,
)


def tr(rid: str, tokens: int, state: int = 3) -> Transition:
    return Transition(
        rollout_id=rid,
        task_id="t",
        group="t",
        step=0,
        agent=None,
        state=list(range(state)),
        action=[4] * tokens,
        action_logprobs=[-0.5] * tokens,
        action_mask=[1] * tokens,
        reward=0.0,
        done=True,
        policy_version=0,
        call_ids=[],
    )


def test_pack_microbatches_by_padded_token_budget() -> None:
    assert pack_microbatches([10, 3, 8, 2, 20], 20) == [[4], [0, 2], [1, 3]]
    assert pack_microbatches([50, 1], 20) == [[0], [1]]  # oversize gets its own
    assert pack_microbatches([], 8) == []
    ts = [tr("a", 5), tr("b", 1)]  # lengths 8 and 4
    assert pack_microbatches(ts, 16) == [[0, 1]] and pack_microbatches(ts, 15) == [[0], [1]]
    with pytest.raises(InvalidInput, match="max_tokens"):
        pack_microbatches([1], 0)


def with_state(t: Transition, state: list[int]) -> Transition:
    return t.model_copy(update={"state": state})


def test_shared_prefix_stops_before_each_last_token() -> None:
    assert shared_prefix([[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 9]]) == 2
    assert shared_prefix([[1, 2, 3], [1, 2, 3]]) == 2  # the last token predicts the action
    assert shared_prefix([[1, 2, 3]]) == 0 and shared_prefix([]) == 0


def test_prefix_packing_puts_rows_that_share_a_prompt_together() -> None:
    """Two agents' calls interleaved (a writer's long shared schema, a checker's short
    shared prompt): packed by state, each micro-batch holds one agent's rows and costs
    shared + rows x (longest - shared), which fits far more rows than padding alone."""
    writer = list(range(100, 400))  # 300 shared tokens
    checker = list(range(500, 550))  # 50
    items = []
    for k in range(8):
        items.append(with_state(tr(f"w{k}", 10), [*writer, 1000 + k, 1001]))
        items.append(with_state(tr(f"c{k}", 10), [*checker, *range(2000 + 60 * k, 2060 + 60 * k)]))
    batches = pack_prefix_microbatches(items, 1200, min_shared=16)
    assert sorted(i for b in batches for i in b) == list(range(16))
    assert sorted(sorted(b) for b in batches) == [list(range(0, 16, 2)), list(range(1, 16, 2))]
    # by padded length alone the same budget needs 4 micro-batches of mixed rows
    assert len(pack_microbatches(items, 1200)) == 4
    # a budget below one agent's shared cost splits its rows, never past the budget
    small = pack_prefix_microbatches(items, 400, min_shared=16)
    assert sorted(i for b in small for i in b) == list(range(16))
    for b in small:
        rows = [items[i] for i in b]
        s = shared_prefix([t.state for t in rows])
        s = s if s >= 16 else 0
        longest = max(len(t.state) + len(t.action) for t in rows)
        assert len(b) == 1 or s + len(b) * (longest - s) <= 400


def test_prefix_packing_never_costs_more_than_padded_packing() -> None:
    """One prompt, replies of very different lengths: one micro-batch of all rows pads the
    short ones to the longest; cut by padded size, two micro-batches (each sharing the
    prompt) cost fewer positions, and that packing is kept."""
    prompt = list(range(100, 300))
    items = [with_state(tr(str(k), 150 if k < 4 else 5), [*prompt, 1000 + k]) for k in range(12)]

    def priced(batches: list[list[int]]) -> int:
        total = 0
        for b in batches:
            s = shared_prefix([items[i].state for i in b])
            longest = max(len(items[i].state) + len(items[i].action) for i in b)
            total += s + len(b) * (longest - s)
        return total

    packed = pack_prefix_microbatches(items, 2000, min_shared=16)
    assert priced(packed) <= priced(pack_microbatches(items, 2000)) < priced([list(range(12))])


def test_prefix_packing_without_shared_prompts_packs_by_length() -> None:
    items = [
        with_state(tr(str(k), n), [k, *range(50 + k)]) for k, n in enumerate([10, 3, 8, 2, 20])
    ]
    assert pack_prefix_microbatches(items, 140, min_shared=16) == pack_microbatches(items, 140)
    oversize = [with_state(tr("big", 500), [1, 2, 3]), with_state(tr("s", 1), [1, 2, 3])]
    assert pack_prefix_microbatches(oversize, 100, min_shared=2) == [[0], [1]]
    assert pack_prefix_microbatches([], 8, min_shared=16) == []
    with pytest.raises(InvalidInput, match="max_tokens"):
        pack_prefix_microbatches(items, 0, min_shared=16)


def test_index_rollouts() -> None:
    ts = [tr("r1", 2), tr("r1", 3), tr("r2", 2), tr("r3", 1)]
    ts[1] = ts[1].model_copy(update={"action_mask": [1, 0, 1]})
    rows, tokens = index_rollouts(ts)
    assert rows == [0, 0, 1, 2] and tokens == [4, 2, 1]


def test_token_logprobs_and_entropy() -> None:
    logits = torch.randn(2, 3, 11, generator=torch.Generator().manual_seed(1))
    targets = torch.randint(0, 11, (2, 3), generator=torch.Generator().manual_seed(2))
    expected = torch.log_softmax(logits, -1).gather(-1, targets[..., None]).squeeze(-1)
    assert_close(token_logprobs(logits, targets), expected)
    hot = torch.log_softmax(logits / 0.7, -1).gather(-1, targets[..., None]).squeeze(-1)
    assert_close(token_logprobs(logits, targets, temperature=0.7), hot)
    with pytest.raises(InvalidInput, match="temperature"):
        token_logprobs(logits, targets, temperature=0.0)
    assert_close(entropy_from_logits(torch.zeros(2, 5)), torch.full((2,), math.log(5)))
