"""Rollout stores, opened by URL.

``open_store("memory://")`` for tests, ``open_store("sqlite:///runs/boltrl.db")`` for the
embedded default (durable, one file), ``open_store("http://host:4747", token=...)`` for a
store served by ``boltrl store serve``. All three keep the promises of ``Store`` and
raise the same errors.
"""

from __future__ import annotations

import urllib.parse

from boltrl.errors import InvalidInput
from boltrl.store._engine import StoreEngine, WorkerInfo
from boltrl.store._sessions import SessionState, session_rollout_id, session_state
from boltrl.store.base import (
    DEFAULT_FEEDBACK_TIMEOUT_S,
    DEFAULT_LEASE_S,
    SessionPage,
    SessionStore,
    Store,
)
from boltrl.store.client import HttpStore
from boltrl.store.memory import MemoryStore
from boltrl.store.sqlite import SqliteStore

__all__ = [
    "DEFAULT_FEEDBACK_TIMEOUT_S",
    "DEFAULT_LEASE_S",
    "HttpStore",
    "MemoryStore",
    "SessionPage",
    "SessionState",
    "SessionStore",
    "SqliteStore",
    "Store",
    "StoreEngine",
    "WorkerInfo",
    "open_store",
    "session_rollout_id",
    "session_state",
]

_FORMS = "memory://, sqlite:///relative/path.db, sqlite:////absolute/path.db or http://host:port"


def open_store(url: str, token: str | None = None) -> Store:
    """Open the store a URL names.

    - ``memory://`` — a fresh in-memory store.
    - ``sqlite:///path.db`` — SQLite file ``path.db`` relative to the working directory;
      ``sqlite:////abs/path.db`` for an absolute path (SQLAlchemy's convention). The
      query ``?synchronous=FULL`` fsyncs every commit (see ``SqliteStore``).
    - ``http://host:port`` / ``https://…`` — a served store; ``token`` is its bearer token.

    Raises ``InvalidInput`` for any other form, naming the accepted ones.
    """
    if not isinstance(url, str):
        raise InvalidInput(f"url: expected a store URL ({_FORMS}), got {type(url).__name__}")
    scheme, sep, rest = url.partition("://")
    scheme = scheme.lower()
    if not sep:
        raise InvalidInput(f"url: {url!r} is not a store URL; expected {_FORMS}")
    if scheme == "memory":
        return MemoryStore()
    if scheme == "sqlite":
        return _open_sqlite(url, rest)
    if scheme in ("http", "https"):
        if not urllib.parse.urlsplit(url).hostname:
            raise InvalidInput(f"url: {url!r} names no host; expected http://host:port")
        return HttpStore(url, token)
    raise InvalidInput(
        f"url: unknown store scheme {scheme + '://'!r} in {url!r}; expected {_FORMS}"
    )


def _open_sqlite(url: str, rest: str) -> SqliteStore:
    # "sqlite:///x.db" → rest "/x.db" → relative "x.db"; "sqlite:////abs" → "/abs".
    if not rest.startswith("/"):
        raise InvalidInput(f"url: {url!r} needs three slashes: sqlite:///path.db")
    path, _, query = rest[1:].partition("?")
    if not path:
        raise InvalidInput(f"url: {url!r} names no database file; expected sqlite:///path.db")
    opts = urllib.parse.parse_qs(query)
    unknown = set(opts) - {"synchronous"}
    if unknown:
        raise InvalidInput(f"url: unknown SQLite option(s) {', '.join(sorted(unknown))}")
    sync = opts.get("synchronous", ["NORMAL"])[-1]
    return SqliteStore(urllib.parse.unquote(path), synchronous=sync)
