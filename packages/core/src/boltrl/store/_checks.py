"""Argument checks shared by every store (and the HTTP server), so a bad value gets the
same error, worded the same way, from memory, SQLite and HTTP."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

from boltrl.errors import InvalidInput
from boltrl.records import (
    RECORD_ADAPTER,
    AnyRecord,
    CallAnnotation,
    LLMCall,
    RewardEvent,
    Rollout,
    RolloutStatus,
    Task,
    ToolStep,
)

_RECORD_TYPES = (LLMCall, CallAnnotation, ToolStep, RewardEvent)


_KINDS = ("llm_call", "call_annotation", "tool_step", "reward")


def validation_message(e: ValidationError, prefix: str = "") -> str:
    """``field.path: what is wrong`` for the first error of a pydantic ValidationError."""
    err = e.errors()[0]
    path = prefix
    loc = err["loc"]
    for i, part in enumerate(loc):
        if part in _KINDS and (i == 0 or isinstance(loc[i - 1], int)):
            continue  # the record union's tag, not a field
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return f"{path or 'body'}: {err['msg']}"


def check_number(name: str, value: Any, *, minimum: float = 0.0, strict: bool = False) -> float:
    """A finite number ``>= minimum`` (``> minimum`` when strict), else InvalidInput."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidInput(f"{name}: expected a finite number, got {value!r}")
    if value < minimum or (strict and value == minimum):
        raise InvalidInput(f"{name}: must be {'>' if strict else '>='} {minimum}, got {value!r}")
    return float(value)


def check_int(name: str, value: Any, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidInput(f"{name}: expected an integer >= {minimum}, got {value!r}")
    return value


def check_status(
    name: str, value: RolloutStatus | str | None, allowed: Iterable[RolloutStatus]
) -> RolloutStatus:
    allowed = tuple(allowed)
    try:
        status = RolloutStatus(value) if isinstance(value, str) else None
    except ValueError:
        status = None
    if status is None or status not in allowed:
        names = ", ".join(s.value for s in allowed)
        raise InvalidInput(f"{name}: expected one of {names}, got {value!r}")
    return status


def check_optional_status(value: RolloutStatus | str | None) -> RolloutStatus | None:
    return None if value is None else check_status("status", value, RolloutStatus)


def check_records(head: Rollout, number: int, records: Sequence[Any]) -> list[AnyRecord]:
    """Validate records for attempt ``number`` and stamp rollout id / attempt on them."""
    if isinstance(records, str | bytes | BaseModel) or not isinstance(records, Sequence):
        raise InvalidInput(f"records: expected a list of records, got {type(records).__name__}")
    out: list[AnyRecord] = []
    for i, r in enumerate(records):
        if isinstance(r, dict):
            try:
                r = RECORD_ADAPTER.validate_python(r)
            except ValidationError as e:
                raise InvalidInput(validation_message(e, f"records[{i}]")) from None
        elif not isinstance(r, _RECORD_TYPES):
            raise InvalidInput(
                f"records[{i}]: expected LLMCall, CallAnnotation, ToolStep or RewardEvent, "
                f"got {type(r).__name__}"
            )
        if not isinstance(r.id, str) or not r.id:
            raise InvalidInput(f"records[{i}].id: must be a non-empty string")
        if r.rollout_id not in ("", head.id):
            raise InvalidInput(
                f"records[{i}].rollout_id: {r.rollout_id!r} is not the attempt's rollout "
                f"{head.id!r}"
            )
        if r.attempt not in (0, number):
            raise InvalidInput(
                f"records[{i}].attempt: {r.attempt} is not the recording attempt {number}"
            )
        if isinstance(r, RewardEvent) and not math.isfinite(r.value):  # model_construct'ed
            raise InvalidInput(f"records[{i}].value: reward must be finite, got {r.value!r}")
        if r.rollout_id != head.id or r.attempt != number:
            r = r.model_copy(update={"rollout_id": head.id, "attempt": number})
        out.append(r)
    return out


def check_tasks(tasks: Sequence[Any]) -> list[Task]:
    if isinstance(tasks, str | bytes | dict | BaseModel) or not isinstance(tasks, Sequence):
        raise InvalidInput(f"tasks: expected a list of Task, got {type(tasks).__name__}")
    out = []
    for i, t in enumerate(tasks):
        if isinstance(t, dict):
            try:
                t = Task.model_validate(t)
            except ValidationError as e:
                raise InvalidInput(validation_message(e, f"tasks[{i}]")) from None
        elif not isinstance(t, Task):
            raise InvalidInput(f"tasks[{i}]: expected a Task, got {type(t).__name__}")
        out.append(t)
    return out
