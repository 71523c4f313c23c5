"""Argument checks shared by every store (and the HTTP server), so a bad value gets the
same error, worded the same way, from memory, SQLite and HTTP."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from enum import Enum
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

MAX_DEPTH = 64
"""Deepest nesting of JSON objects and arrays inside one task or record (a tool schema in
``LLMCall.request``, a task's input). The JSON reader records are read back with stops at
200 levels, counting the levels a stored rollout wraps around its records; 64 leaves that
margin and is deeper than any real schema. Not configurable upward for that reason."""

MAX_VALUE_BYTES = 16 * 2**20
"""Largest task or record, counted as its strings' characters plus 8 bytes per number: a
store refuses larger ones (``InvalidInput``). Served stores also cap request bodies
(``boltrl store serve --max-body-mb``, 64 MiB by default)."""

MAX_INT = 2**63 - 1
"""Largest integer a task or record may hold: SQLite's, and what JSON writers and readers
hold exactly (beyond it some read back as floats, others refuse to write)."""


class _Unreadable(Exception):
    def __init__(self, path: str, what: str) -> None:
        super().__init__(path, what)
        self.path, self.what = path, what

    def message(self) -> str:
        p = self.path
        return f"{p if len(p) <= 160 else f'{p[:80]}…{p[-60:]}'}: {self.what}"


def check_readable(path: str, value: Any) -> int:
    """Refuse (``InvalidInput`` naming the field, as ``tasks[0].input.a[3]``) what would
    be accepted but not read back: NaN or ±inf, integers beyond ``MAX_INT``, strings that
    are not valid Unicode (lone surrogates), object keys that are not strings, objects
    that are not JSON, nesting deeper than ``MAX_DEPTH``, values larger than
    ``MAX_VALUE_BYTES``. ``value`` is JSON data or a record (a pydantic model: its fields
    are checked). Returns the value's approximate size."""
    try:
        return _walk(path, value)
    except _Unreadable as e:
        raise InvalidInput(e.message()) from None


def find_unreadable(path: str, value: Any) -> tuple[str, str] | None:
    """``check_readable`` as a value: None, or (the field's path, the error message)."""
    try:
        _walk(path, value)
    except _Unreadable as e:
        return e.path, e.message()
    return None


def _walk(path: str, value: Any) -> int:
    """Iterative, so hostile nesting cannot exhaust the stack."""
    size = 0
    stack: list[tuple[str, Any, int]] = [(path, value, 0)]
    while stack:
        where, v, d = stack.pop()
        if isinstance(v, BaseModel):
            items: Iterable[tuple[Any, Any]] = vars(v).items()
            d -= 1  # a record's fields are not a nesting level of its JSON
        elif isinstance(v, dict):
            items = v.items()
        elif isinstance(v, list | tuple):
            if _plain_numbers(v):  # token ids and logprobs: checked at C speed
                size += 8 * len(v)
                continue
            items = enumerate(v)
        else:
            size += _scalar(where, v)
            continue
        if d >= MAX_DEPTH:
            raise _Unreadable(where, f"nested deeper than {MAX_DEPTH} levels")
        for k, x in items:
            if isinstance(k, int):
                sub = f"{where}[{k}]"
            elif isinstance(k, str):
                sub = f"{where}.{k}" if where else k
                size += _scalar(sub, k) if not k.isascii() else len(k)
            else:
                raise _Unreadable(where, f"object key {k!r} is not a string")
            if isinstance(x, dict | list | tuple | BaseModel):
                stack.append((sub, x, d + 1))
            else:
                size += _scalar(sub, x)
        if size > MAX_VALUE_BYTES:
            raise _Unreadable(where or "value", f"larger than {MAX_VALUE_BYTES:,} bytes")
    return size


def _plain_numbers(v: list[Any] | tuple[Any, ...]) -> bool:
    """Whether ``v`` is non-empty and all finite floats and in-range ints (else the
    caller walks it item by item, which also finds the culprit)."""
    if not v or type(v[0]) not in (int, float):
        return False
    try:
        # A sum is non-finite when any item is NaN or ±inf (or finite floats overflow:
        # then the item walk accepts them); it raises for anything but numbers.
        total = sum(v)
    except (TypeError, OverflowError):
        return False
    if isinstance(total, float) and not math.isfinite(total):
        return False
    return bool(-MAX_INT - 1 <= min(v) and max(v) <= MAX_INT)


def _scalar(where: str, v: Any) -> int:
    if v is None or isinstance(v, bool):
        return 4
    if isinstance(v, str):
        if not v.isascii():
            try:
                v.encode()
            except UnicodeEncodeError:
                raise _Unreadable(where, "string is not valid Unicode (a lone surrogate)") from None
        return len(v)
    if isinstance(v, int):
        if not -MAX_INT - 1 <= v <= MAX_INT:
            raise _Unreadable(where, f"integer out of range (beyond ±{MAX_INT})")
        return 8
    if isinstance(v, float):
        if not math.isfinite(v):
            raise _Unreadable(where, f"expected a finite number, got {v!r}")
        return 8
    if isinstance(v, Enum):
        return len(str(v.value))
    raise _Unreadable(where, f"{type(v).__name__} is not JSON")


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


def check_int(name: str, value: Any, *, minimum: int, maximum: int = MAX_INT) -> int:
    """An integer in ``[minimum, maximum]`` (by default no larger than SQLite and JSON
    readers hold), else InvalidInput."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidInput(f"{name}: expected an integer >= {minimum}, got {value!r}")
    if value > maximum:
        raise InvalidInput(f"{name}: must be <= {maximum}, got {value!r}")
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
        check_readable(f"records[{i}]", r)
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
        check_readable(f"tasks[{i}]", t)
        out.append(t)
    return out
