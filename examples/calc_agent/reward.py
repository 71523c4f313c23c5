"""calc_agent's reward: exact numeric match of the reply's final answer with the gold number."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_NUMBER = re.compile(r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
_MARKER = re.compile(r"(?:answer\s*(?:is|:|=)|####|\\boxed\{)", re.IGNORECASE)


def final_number(reply: str | None) -> Decimal | None:
    """The reply's answer: the first number after its last "answer is" / "Answer:" /
    ``####`` / ``\\boxed{`` marker, else its last number; None when it has no number.
    Thousands separators are ignored ("1,234" is 1234)."""
    if not isinstance(reply, str):
        return None
    markers = list(_MARKER.finditer(reply))
    tail = reply[markers[-1].end() :] if markers else reply
    found = _NUMBER.findall(tail)
    if not found:
        return None
    text = found[0] if markers else found[-1]
    try:
        return Decimal(text.replace(",", ""))
    except InvalidOperation:
        return None


def exact_match(reply: str | None, gold: float | int | str) -> float:
    """1.0 when the reply's answer equals ``gold`` exactly (56 == 56.0), else 0.0."""
    got = final_number(reply)
    try:
        want = Decimal(str(gold).replace(",", ""))
    except InvalidOperation:
        return 0.0
    return 1.0 if got is not None and got == want else 0.0
