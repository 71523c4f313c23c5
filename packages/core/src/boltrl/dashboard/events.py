"""Live updates: one watcher thread per dashboard pushes store changes to every open
page as server-sent events.

The watcher asks the source for its change token every ``poll_s`` (for SQLite one
``PRAGMA data_version``, which changes whenever the writer commits — the only signal a
reader in another process can get without the writer's help) and, when it changed,
refreshes the ``Tracker`` and sends a ``change`` event naming the rollouts that
appeared or changed status. While rollouts are running it also sends a ``tick`` every
``tick_s`` so pages showing a running rollout pick up its new records. The thread runs
only while at least one page is subscribed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

from boltrl.dashboard.stats import Tracker

log = logging.getLogger(__name__)

_QUEUE_MAX = 64
_KEEPALIVE_S = 15.0


def _offer(queue: asyncio.Queue[str | None], item: str | None) -> None:
    with contextlib.suppress(asyncio.QueueFull):  # a slow page refetches on the next one
        queue.put_nowait(item)


def sse(event: str, data: Any) -> str:
    """One server-sent event."""
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


class Hub:
    """Fans tracker changes out to subscribed pages (see the module docstring)."""

    def __init__(self, tracker: Tracker, *, poll_s: float = 0.5, tick_s: float = 2.0) -> None:
        self.tracker = tracker
        self.poll_s = poll_s
        self.tick_s = tick_s
        self._subs: dict[asyncio.Queue[str | None], asyncio.AbstractEventLoop] = {}
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False
        self.version = 0
        """Incremented with every change event."""

    def _broadcast(self, item: str | None) -> None:
        with self._cond:
            subs = list(self._subs.items())
        for queue, loop in subs:
            with contextlib.suppress(RuntimeError):  # the page's loop is gone
                loop.call_soon_threadsafe(_offer, queue, item)

    def _run(self) -> None:
        last_tick = time.monotonic()
        while True:
            with self._cond:
                while not self._subs and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                self._cond.wait(self.poll_s)
                if self._closed:
                    return
            try:
                change = self.tracker.refresh()
            except Exception:  # the store may be briefly unreachable; try again next time
                log.exception("dashboard: could not refresh from the store")
                continue
            now = time.monotonic()
            if change is not None:
                self.version += 1
                data = {"version": self.version, "counts": change.counts}
                data |= {"changed": change.changed, "finished": len(change.finished)}
                self._broadcast(sse("change", data))
                last_tick = now
            elif now - last_tick >= self.tick_s and self.tracker.active:
                self._broadcast(sse("tick", {"version": self.version}))
                last_tick = now

    async def stream(self, is_disconnected: Any) -> AsyncIterator[str]:
        """The event stream of one page, until it disconnects or the hub closes."""
        queue: asyncio.Queue[str | None] = asyncio.Queue(_QUEUE_MAX)
        with self._cond:
            if self._closed:
                return
            self._subs[queue] = asyncio.get_running_loop()
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="boltrl-dashboard-watch", daemon=True
                )
                self._thread.start()
            self._cond.notify_all()
        try:
            yield "retry: 2000\n\n" + sse("hello", {"version": self.version})
            while True:
                try:
                    item = await asyncio.wait_for(queue.get(), _KEEPALIVE_S)
                except TimeoutError:
                    if await is_disconnected():
                        return
                    yield ": keepalive\n\n"
                    continue
                if item is None:
                    return
                yield item
        finally:
            with self._cond:
                self._subs.pop(queue, None)

    def close(self) -> None:
        """End every stream and stop the watcher (idempotent, thread-safe)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread = self._thread
        self._broadcast(None)
        if thread is not None and thread is not threading.current_thread():
            thread.join(5)
