"""Open each kind of store for the store contract suite, and compare store states.

``open_kind("http", tmp)`` serves a SQLite store over a real uvicorn server on a free
127.0.0.1 port in this process; closing the returned handle stops it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from boltrl.records import Rollout
from boltrl.store import HttpStore, MemoryStore, SqliteStore, Store
from boltrl.store.server import RunningServer, serve_in_thread

KINDS = ["memory", "sqlite", "http"]


@dataclass
class Opened:
    """A store under test and what must be closed after it."""

    store: Store
    kind: str
    backing: Store | None = None
    """For ``http``: the SQLite store the server serves."""
    server: RunningServer | None = None
    path: Path | None = None
    token: str | None = None
    extra: list[Any] = field(default_factory=list)

    def close(self) -> None:
        self.store.close()
        if self.backing is not None:
            self.backing.close()  # wakes long-polls still blocked in the server
        if self.server is not None:
            self.server.stop()


def open_kind(kind: str, tmp: Path, *, token: str | None = None) -> Opened:
    if kind == "memory":
        return Opened(MemoryStore(), kind)
    if kind == "sqlite":
        path = tmp / "store.db"
        return Opened(SqliteStore(path), kind, path=path)
    if kind == "http":
        path = tmp / "served.db"
        backing = SqliteStore(path)
        server = serve_in_thread(backing, token=token)
        client = HttpStore(server.url, token, retries=2, backoff_s=0.05)
        return Opened(client, kind, backing, server, path, token)
    raise ValueError(kind)


def snapshot(store: Store) -> dict[str, Any]:
    """Everything observable about a store: rollouts with records, counts, resources."""
    heads = store.query(limit=10_000)
    full: list[Rollout] = [store.get(h.id) for h in heads]
    return {
        "rollouts": [r.model_dump(mode="json") for r in full],
        "count": store.count(),
        "resources": store.resources().model_dump(mode="json"),
    }
