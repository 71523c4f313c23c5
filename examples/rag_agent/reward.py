"""rag_agent's rewards: token F1 of the answer against the gold answers (SQuAD-style),
and a small intermediate reward for each gold document the search brings up."""

from __future__ import annotations

import re
import string
from collections import Counter

GOLD_DOC_REWARD = 0.1
"""Intermediate reward for the first retrieval of each supporting document."""

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)
_ANSWER = re.compile(r"answer\s*(?:is|:)\s*", re.IGNORECASE)


def normalize(text: str) -> list[str]:
    """Lower-case, drop punctuation and articles, split on whitespace."""
    return _ARTICLES.sub(" ", text.lower().translate(_PUNCT)).split()


def final_answer(reply: str | None) -> str:
    """The answer part of a reply: what follows its last "Answer:" / "answer is", else all."""
    if not isinstance(reply, str):
        return ""
    parts = _ANSWER.split(reply)
    return parts[-1].strip()


def token_f1(prediction: str | None, gold: str) -> float:
    """Harmonic mean of token precision and recall (0.0 for an empty or missing answer)."""
    pred, want = normalize(prediction or ""), normalize(gold)
    common = sum((Counter(pred) & Counter(want)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(want)
    return 2 * precision * recall / (precision + recall)


def answer_f1(reply: str | None, answers: list[str]) -> float:
    """The best token F1 of the reply's answer against any of the gold answers."""
    answer = final_answer(reply)
    return max((token_f1(answer, gold) for gold in answers), default=0.0)
