"""The task metric: is the program's answer the gold answer?

``numeric`` (the shipped unit conversions, GSM8K): the last number in the answer equals
the gold number within a relative 1e-4 (``1,500`` and ``1500.0`` both match ``1500``;
units and words around the number are ignored). ``exact``: the same text after trimming
whitespace and case. An answer that is missing or holds no number scores 0.

``metric(example, prediction)`` has DSPy's metric signature, so the same function scores
the program in DSPy's own ``Evaluate`` and optimizers.
"""

from __future__ import annotations

import math
import re
from typing import Any

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def parse_number(text: str | None) -> float | None:
    """The last number in ``text`` (thousands separators allowed), or None."""
    if not text:
        return None
    found = _NUMBER.findall(re.sub(r"(?<=\d),(?=\d{3}\b)", "", text))
    return float(found[-1]) if found else None


def numeric_match(answer: str | None, gold: str) -> float:
    """1.0 when the last number in ``answer`` equals ``gold`` (relative tolerance 1e-4)."""
    got, want = parse_number(answer), parse_number(gold)
    if got is None or want is None:
        return 0.0
    return 1.0 if math.isclose(got, want, rel_tol=1e-4, abs_tol=1e-9) else 0.0


def exact_match(answer: str | None, gold: str) -> float:
    """1.0 when ``answer`` is ``gold`` up to surrounding whitespace and case."""
    return 1.0 if (answer or "").strip().lower() == gold.strip().lower() else 0.0


METRICS = {"numeric": numeric_match, "exact": exact_match}


def score(task: dict[str, Any], answer: str | None) -> float:
    """The task's own metric (``task["metric"]``, default ``numeric``) on ``answer``."""
    return METRICS[task.get("metric", "numeric")](answer, str(task["answer"]))


def metric(example: Any, prediction: Any, trace: Any = None) -> float:
    """DSPy's metric signature: ``example.answer`` (and ``.metric``) vs ``prediction.answer``."""
    task = {"answer": example.answer, "metric": getattr(example, "metric", None) or "numeric"}
    return score(task, getattr(prediction, "answer", None))
