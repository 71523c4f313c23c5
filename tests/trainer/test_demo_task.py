"""The demo's task set and reward: deterministic, disjoint splits, strict scoring."""

from __future__ import annotations

import pytest

from boltrl_trainer.config import load_config
from boltrl_trainer.demo import DEMO_CONFIG, lenient_score, score, train_tasks, val_tasks


def test_splits_are_deterministic_and_disjoint() -> None:
    assert [t.id for t in train_tasks()] == [t.id for t in train_tasks()]
    train = {(t.input["a"], t.input["b"]) for t in train_tasks()}
    val = {(t.input["a"], t.input["b"]) for t in val_tasks()}
    assert len(train) == 256 and len(val) == 64
    assert not train & val
    assert all(10 <= t.input["a"] <= 99 and 10 <= t.input["b"] <= 99 for t in val_tasks())


@pytest.mark.parametrize(
    ("reply", "answer", "expected"),
    [
        ("42", 42, 1.0),
        (" 42.\n", 42, 1.0),
        ("1,042", 1042, 1.0),
        ("43", 42, 0.0),
        ("The answer is 42.", 42, 0.5),
        ("12 + 30 = 42", 42, 0.5),
        ("42 is not 43", 42, 0.0),
        ("", 42, 0.0),
        ("forty-two", 42, 0.0),
    ],
)
def test_score_wants_the_right_number_alone(reply: str, answer: int, expected: float) -> None:
    assert score(reply, answer) == expected


@pytest.mark.parametrize(
    ("reply", "answer", "expected"),
    [
        ("42", 42, 1.0),
        ("12 + 30 = 42", 42, 1.0),
        ("The answer is 42.", 42, 1.0),
        ("1,042", 1042, 1.0),
        ("42 is not 43", 42, 0.0),
        ("12 + 30 = 43", 42, 0.0),
        ("", 42, 0.0),
    ],
)
def test_lenient_score_wants_the_right_last_number(
    reply: str, answer: int, expected: float
) -> None:
    assert lenient_score(reply, answer) == expected


def test_demo_config_is_valid() -> None:
    cfg = load_config(data=dict(DEMO_CONFIG))
    assert cfg.agent == "boltrl_trainer.demo:agent"
    assert cfg.batch_tasks * cfg.group_size <= cfg.concurrency
