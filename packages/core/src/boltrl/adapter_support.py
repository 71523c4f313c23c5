"""Plumbing the framework adapters share: the counters behind each adapter's ``stats()``,
the ways a hook reports trouble without raising into the user's agent, the global
install behind each adapter's ``instrument()`` / ``uninstrument()`` / ``installed()``,
and ``jsonable`` for the SDK objects a record carries.

An adapter's hooks run on the agent's path, inside the framework. They promise never to
raise: a hook wrapped in ``Counters.guard`` that fails is logged and counted (the way
openinference's instrumentors wrap theirs in ``stop_on_exception``), and each field of a
record is extracted on its own (``Counters.field``), so one odd field is left empty and
the rest of the record kept.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any, Generic, ParamSpec, TypeVar

from boltrl._common import new_id

__all__ = ["Counters", "Installation", "json_or_str", "jsonable", "new_id", "parse_arguments"]

T = TypeVar("T")
P = ParamSpec("P")

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


def json_or_str(value: Any) -> Any:
    """``value`` when it survives ``json.dumps``, else its ``str``."""
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return str(value)


def parse_arguments(raw: Any) -> Any:
    """Tool arguments as JSON: a JSON string parsed, anything else as ``json_or_str``
    gives it (a string that is not JSON stays the string)."""
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    return json_or_str(raw)


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

    def guard(
        self, where: str | Callable[..., str] | None = None
    ) -> Callable[[Callable[P, None]], Callable[P, None]]:
        """A decorator for a hook: an exception out of the hook is not raised but counted
        and logged as ``failed`` does (naming ``where``: a string, a function of the
        hook's arguments for a name that depends on them, or by default the hook's
        name). The hook returns None either way; it must not be a generator or async."""

        def wrap(hook: Callable[P, None]) -> Callable[P, None]:
            name = hook.__name__

            @functools.wraps(hook)
            def guarded(*args: P.args, **kwargs: P.kwargs) -> None:
                try:
                    hook(*args, **kwargs)
                except Exception:
                    self.failed(self._where(where, name, args, kwargs))

            return guarded

        return wrap

    @staticmethod
    def _where(where: str | Callable[..., str] | None, name: str, args: Any, kwargs: Any) -> str:
        if where is None:
            return name
        if isinstance(where, str):
            return where
        try:
            return where(*args, **kwargs)
        except Exception:  # naming the failure must not fail in turn
            return name

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


class Installation(Generic[T]):
    """One adapter's process-global install: what ``instrument()``, ``uninstrument()``
    and ``installed()`` share, so each adapter writes only how it attaches to its SDK.

    ``instrument(attach)`` calls ``attach()`` once (later calls return the installed
    hook without calling it); ``attach`` returns the hook and a function that undoes
    exactly what it did. ``uninstrument()`` calls that function once. Both hold one lock,
    so concurrent calls install at most once and undo at most once; an ``attach`` that
    raises installs nothing and the error reaches the caller (a bug or an SDK that
    changed shape: the user asked to instrument and must hear that it did not happen).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._hook: T | None = None
        self._undo: Callable[[], None] | None = None

    def instrument(self, attach: Callable[[], tuple[T, Callable[[], None]]]) -> T:
        """The installed hook; installs it with ``attach()`` first when none is."""
        with self._lock:
            if self._hook is None:
                self._hook, self._undo = attach()
            return self._hook

    def uninstrument(self) -> None:
        """Undo the install, if there is one (idempotent)."""
        with self._lock:
            undo, self._hook, self._undo = self._undo, None, None
            if undo is not None:
                undo()

    def installed(self) -> T | None:
        """The installed hook, or None."""
        return self._hook
