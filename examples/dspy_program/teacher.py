"""dspy_program's teacher for the warm start: plays both predictors from a training task.

With ``teacher: teacher.py:teach`` in a ``warm_start:`` section, the real DSPy program runs
with this function in the model's place, answering in DSPy's field format
(``[[ ## plan ## ]]`` ... ``[[ ## completed ## ]]``): the ``plan`` predictor gets the
conversion steps (the quantity, the factor between the units, the product), the ``answer``
predictor gets the gold number. boltrl renders both in the student's chat template and
token ids. Only training tasks ever reach it (boltrl enforces that).
"""

from __future__ import annotations

import re
import sys
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dspy_program.data import UNITS, fmt

_QUANTITY = re.compile(r"(\d+(?:\.\d+)?) (" + "|".join(UNITS) + r")\b")
_TARGET = re.compile(r"How many (" + "|".join(UNITS) + r")\b")
# the shipped word problems (data.py:_word), each spelled out step by step
_WALK = re.compile(r"walks (\d+) meters to school and \d+ meters back each day.*in (\d+) days")
_POUR = re.compile(r"pours (\d+) glasses of (\d+) milliliters each")
_PRACTISE = re.compile(r"for (\d+) minutes a day.*over (\d+) days")


def _word_plan(question: str, answer: str) -> str | None:
    """Every multiplication and the conversion of a shipped word problem, or None."""
    if m := _WALK.search(question):
        d, days = int(m.group(1)), int(m.group(2))
        return (
            f"1. Each day: 2 * {d} = {2 * d} meters.\n"
            f"2. In {days} days: {2 * d} * {days} = {2 * d * days} meters.\n"
            f"3. {2 * d * days} meters / 1000 = {answer} kilometers."
        )
    if m := _POUR.search(question):
        n, ml = int(m.group(1)), int(m.group(2))
        return (
            f"1. {n} * {ml} = {n * ml} milliliters.\n"
            f"2. {n * ml} milliliters / 1000 = {answer} liters."
        )
    if m := _PRACTISE.search(question):
        mins, days = int(m.group(1)), int(m.group(2))
        return (
            f"1. {mins} * {days} = {mins * days} minutes.\n"
            f"2. {mins * days} minutes / 60 = {answer} hours."
        )
    return None


def plan_for(task: dict[str, Any]) -> str:
    """Numbered steps that lead to the task's gold answer."""
    question, answer = task["question"], str(task["answer"])
    if (word := _word_plan(question, answer)) is not None:
        return word
    found, target = _QUANTITY.findall(question), _TARGET.search(question)
    unit = target.group(1) if target else "the asked unit"
    if len(found) == 1 and target and UNITS[found[0][1]][0] == UNITS[unit][0]:
        q, src = found[0]
        try:
            factor = fmt(UNITS[src][1] / UNITS[unit][1])
        except InvalidOperation:
            factor = ""
        if factor and Decimal(q) * Decimal(factor) == Decimal(answer):
            return (
                f"1. The quantity is {q} {src}.\n"
                f"2. One {src.rstrip('s')} is {factor} {unit}.\n"
                f"3. {q} * {factor} = {answer} {unit}."
            )
        inverse = UNITS[unit][1] / UNITS[src][1]  # 3600 seconds in an hour: divide
        if inverse == inverse.to_integral_value() and Decimal(q) / inverse == Decimal(answer):
            return (
                f"1. The quantity is {q} {src}.\n"
                f"2. One {unit.rstrip('s')} is {fmt(inverse)} {src}.\n"
                f"3. {q} / {fmt(inverse)} = {answer} {unit}."
            )
    return f"1. Work out the total quantity in the question.\n2. Convert it to {unit}: {answer}."


def _fields(name: str, value: str) -> str:
    return f"[[ ## {name} ## ]]\n{value}\n\n[[ ## completed ## ]]"


def teach(task: dict[str, Any], request: Any) -> str:
    """The reply of the predictor that asks: the one whose output field the prompt names."""
    prompt = str(request.messages[-1].get("content") or "")
    if "`[[ ## answer ## ]]`" in prompt:  # "... starting with the field `[[ ## answer ## ]]`"
        return _fields("answer", str(task["answer"]))
    return _fields("plan", plan_for(task))
