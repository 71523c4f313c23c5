"""Plumbing the framework adapters share: the counters behind each adapter's ``stats()``,
the two ways a hook reports trouble without raising into the user's agent, and
``jsonable`` for the SDK objects a record carries.

An adapter's hooks run on the agent's path, inside the framework. They promise never to
raise: a hook body that fails is logged and counted (``Counters.failed``), and each field
of a record is extracted on its own (``Counters.field``), so one odd field is left empty
and the rest of the record kept.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from boltrl._common import new_id

__all__ = ["Counters", "jsonable", "new_id"]

T = TypeVar("T")

_SCALARS = frozenset({str, int, float, bool, type(None)})


def jsonable(value: Any, dumps: tuple[str, ...] = ("model_dump",)) -> Any:
    """``value`` as JSON-serializable data: itself when it already is; mappings and
    sequences rebuilt item by item (keys as strings); any other object through the first
    of its ``dumps`` methods that works (pydantic's ``model_dump``), else ``str()``."""
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is dict:  # exact types first: no ABC checks on the hot path (messages)
        return {k if type(k) is str else str(k): jsonable(v, dumps) for k, v in value.items()}
    if kind is list or kind is tuple:
        return [jsonable(v, dumps) for v in value]
    if isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, Mapping):
        return {str(k): jsonable(v, dumps) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v, dumps) for v in value]
    for method in dumps:
        dump = getattr(value, method, None)
        if callable(dump):
            try:
                return jsonable(dump(), dumps)
            except Exception:
                pass
    return str(value)


class Counters:
    """Counters of one adapter since import, safe to bump from any thread.

    Holds the adapter's own keys (e.g. ``calls``, ``tool_steps``) and always ``failures``
    (a hook that could not record) and ``field_failures`` (one field left empty). No
    method raises, except ``count`` for a key it was not given (a bug in the adapter).
    """

    def __init__(self, name: str, log: logging.Logger, *keys: str) -> None:
        """``name`` starts each logged line (the adapter's import name); ``log`` is the
        adapter's logger; ``keys`` are its counters besides the two failure counts."""
        self._name = name
        self._log = log
        self._lock = threading.Lock()
        self._counts = dict.fromkeys((*keys, "failures", "field_failures"), 0)

    def count(self, key: str) -> None:
        """Add one to ``key``."""
        with self._lock:
            self._counts[key] += 1

    def snapshot(self) -> dict[str, int]:
        """A copy of every counter, taken at once."""
        with self._lock:
            return dict(self._counts)

    def failed(self, where: str) -> None:
        """Count a hook that could not record, and log the exception being handled as a
        warning naming ``where``; call it from the ``except`` block that caught it."""
        self.count("failures")
        self._log.warning("%s: %s failed; the record is lost", self._name, where, exc_info=True)

    def field(self, fn: Callable[..., T | None], *args: Any) -> T | None:
        """``fn(*args)``, or None (counted as a field failure, logged at debug) if it
        raises."""
        try:
            return fn(*args)
        except Exception:
            self.count("field_failures")
            self._log.debug(
                "%s: %s failed; field left empty", self._name, fn.__name__, exc_info=True
            )
            return None
