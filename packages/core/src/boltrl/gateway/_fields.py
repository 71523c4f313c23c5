"""Field checks for request bodies: each names the field and what was wrong with it.

Hand-written rather than pydantic models because the gateway accepts OpenAI's open-ended
request shapes (unknown fields pass through) and validates only what it reads, on the
hot path, with errors in OpenAI's wording.
"""

from __future__ import annotations

from typing import Any

from boltrl._common import JSON
from boltrl.gateway._errors import RequestError
from boltrl.store._checks import MAX_INT


def json_type(value: Any) -> str:
    """The JSON name of a value's type, for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def expect(value: Any, kind: type | tuple[type, ...], param: str, what: str) -> Any:
    """``value`` if it is an instance of ``kind`` (booleans are never numbers), else a 400."""
    if isinstance(value, kind) and not (isinstance(value, bool) and bool not in _kinds(kind)):
        return value
    raise RequestError(f"'{param}' must be {what}, got {json_type(value)}", param)


def _kinds(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def opt_number(
    body: JSON, key: str, *, lo: float | None = None, hi: float | None = None
) -> float | None:
    """An optional number within ``[lo, hi]``."""
    value = body.get(key)
    if value is None:
        return None
    v = float(expect(value, (int, float), key, "a number"))
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise RequestError(f"'{key}' must be between {lo} and {hi}, got {value}", key)
    return v


def opt_int(body: JSON, key: str, *, lo: int | None = None, hi: int = MAX_INT) -> int | None:
    """An optional integer, at least ``lo``, at most ``hi`` (by default what a record can
    hold: a larger one would be served but not recorded)."""
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    v: int = expect(value, int, key, "an integer")
    if lo is not None and v < lo:
        raise RequestError(f"'{key}' must be at least {lo}, got {v}", key)
    if v > hi:
        raise RequestError(f"'{key}' must be at most {hi}, got {v}", key)
    return v


def opt_bool(body: JSON, key: str) -> bool | None:
    value = body.get(key)
    if value is None:
        return None
    result: bool = expect(value, bool, key, "a boolean")
    return result


def opt_str(body: JSON, key: str) -> str | None:
    value = body.get(key)
    if value is None:
        return None
    result: str = expect(value, str, key, "a string")
    return result


def opt_object(body: JSON, key: str) -> JSON | None:
    value = body.get(key)
    if value is None:
        return None
    result: JSON = expect(value, dict, key, "an object")
    return result


def stop_list(body: JSON) -> list[str]:
    """``stop`` as a list: OpenAI accepts a string or an array of strings."""
    value = body.get("stop")
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    expect(value, list, "stop", "a string or an array of strings")
    for i, s in enumerate(value):
        expect(s, str, f"stop[{i}]", "a string")
    return list(value)


def reject_unsupported(body: JSON) -> None:
    """Refuse sampling controls the gateway would otherwise silently ignore: honoring a
    request differently than asked would make the recorded sampling distribution a lie."""
    for key in ("presence_penalty", "frequency_penalty"):
        v = opt_number(body, key, lo=-2.0, hi=2.0)
        if v:
            raise RequestError(
                f"'{key}' is not supported by the boltrl gateway (omit it or send 0)", key
            )
    bias = body.get("logit_bias")
    if bias:
        raise RequestError("'logit_bias' is not supported by the boltrl gateway", "logit_bias")
    if body.get("functions") is not None or body.get("function_call") is not None:
        param = "functions" if body.get("functions") is not None else "function_call"
        raise RequestError(f"'{param}' is deprecated and not supported: use 'tools'", param)
