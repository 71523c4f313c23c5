"""Each example's teacher (``examples/*/teacher.py``), through the example's real agent and
a real gateway, in the student's place: every demonstration earns the example's maximum
reward, is marked as a demonstration, and its ids are exactly what the student's next
prompt holds (the tiny model has SmolLM2's tokenizer and chat template)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from trainer_harness import collect_demos

from boltrl.credit import CreditConfig, rollout_return
from boltrl.records import RolloutStatus
from boltrl.store import open_store
from boltrl_trainer.config import load_config
from boltrl_trainer.models import tiny_model

ROOT = Path(__file__).resolve().parents[2] / "examples"
_SIBLINGS = ("data", "reward")

CASES = {
    # example: (config, tasks, max reward, model calls per rollout, agents)
    "calc_agent": ("train.yaml", 8, 1.0, {2}, {"solver"}),
    "rag_agent": ("train.yaml", 6, 1.0, {3}, {"researcher"}),
    "sql_agent": ("train.yaml", 6, 1.0, {2}, {"writer", "checker"}),
    "dspy_program": ("train.yaml", 8, 1.0, {2}, {"plan", "answer"}),
}


@pytest.fixture(scope="module")
def tokenizer() -> object:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model()))


@pytest.fixture
def isolated() -> Iterator[None]:
    """Examples share sibling module names (``data``, ``reward``): load each afresh."""
    saved = {k: sys.modules.pop(k) for k in _SIBLINGS if k in sys.modules}
    path = list(sys.path)
    try:
        yield
    finally:
        for k in _SIBLINGS:
            sys.modules.pop(k, None)
        sys.modules.update(saved)
        sys.path[:] = path


@pytest.mark.parametrize("name", sorted(CASES))
def test_teacher_earns_the_max_reward_through_the_real_agent(
    name: str, isolated: None, tokenizer: object
) -> None:
    config, n, best, calls, agents = CASES[name]
    cfg = load_config(
        ROOT / name / config,
        [f"model={tiny_model()}", f"warm_start.limit={n}", "concurrency=4", "progress=false"],
    )
    assert cfg.warm_start is not None and cfg.warm_start.teacher.endswith("teacher.py:teach")
    store = open_store("memory://")
    try:
        demos = collect_demos(cfg, tokenizer, store)
        rollouts = [store.get(r.id) for r in store.query(limit=100)]
    finally:
        store.close()
    errors = [(r.task.id, r.error) for r in rollouts if r.status != RolloutStatus.SUCCEEDED]
    assert not errors, errors
    credit = CreditConfig.from_dict(cfg.credit)  # the return train.yaml trains on
    assert [rollout_return(r, credit) for r in rollouts] == pytest.approx([best] * n)
    assert (demos.rollouts, demos.kept, demos.failed, demos.rejected) == (n, n, 0, 0)
    assert all(r.task.split == "train" for r in rollouts)
    for r in rollouts:
        assert len(r.calls) in calls, (r.task.id, [c.agent for c in r.calls])
        assert {c.agent for c in r.calls} == agents
        assert all(c.demonstration == "function:teacher.py:teach" for c in r.calls)
        assert all(c.response_logprobs is None for c in r.calls)
        # within one agent's conversation the next prompt holds the demonstrated ids
        for prev, nxt in zip(r.calls, r.calls[1:], strict=False):
            assert prev.prompt_token_ids and prev.response_token_ids and nxt.prompt_token_ids
            head = prev.prompt_token_ids + prev.response_token_ids
            if prev.agent == nxt.agent and name in ("calc_agent", "rag_agent"):
                assert nxt.prompt_token_ids[: len(head)] == head, (r.task.id, prev.agent)
    trained = {t.agent for t in demos.transitions}
    allowed = set(cfg.credit.get("agents") or agents)
    assert trained == agents & allowed


def test_sql_writer_only_config_trains_the_writer(isolated: None, tokenizer: object) -> None:
    cfg = load_config(
        ROOT / "sql_agent" / "train_writer.yaml",
        [f"model={tiny_model()}", "warm_start.limit=2", "concurrency=2", "progress=false"],
    )
    assert cfg.warm_start is not None
    store = open_store("memory://")
    try:
        demos = collect_demos(cfg, tokenizer, store)
    finally:
        store.close()
    assert demos.kept == 2
    assert [t.agent for t in demos.transitions] == ["writer", "writer"]
