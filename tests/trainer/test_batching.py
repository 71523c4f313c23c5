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
