"""Rollouts from a dashboard ``Source``, all at once or as they finish, and the live
OTLP follower (``boltrl export --otlp E --follow``, ``boltrl dashboard --otlp E``)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence

from boltrl.dashboard.model import Filters, HeadInfo, Source
from boltrl.dashboard.stats import Tracker
from boltrl.errors import BoltrlError, NotFound
from boltrl.export.otlp import OtlpExporter
from boltrl.records import Rollout
from boltrl.store.base import Store

log = logging.getLogger(__name__)

_PAGE = 5000
_BATCH = 64
_MAX_PENDING = 10_000


def finished_heads(source: Source, filters: Filters) -> Iterator[HeadInfo]:
    """Finished rollouts matching ``filters`` (status, run, task), oldest first."""
    cursor = 0
    while True:
        batch = source.heads_after(cursor, _PAGE)
        for h in batch:
            if h.terminal and filters.matches(h):
                yield h
        if len(batch) < _PAGE:
            return
        cursor = batch[-1].ord


def rollouts_of(
    source: Source, heads: Iterator[HeadInfo] | Sequence[HeadInfo]
) -> Iterator[Rollout]:
    """The whole rollouts (records included) of ``heads``; vanished ones are skipped."""
    for h in heads:
        try:
            yield source.get(h.id)
        except NotFound:
            continue


class OtlpFollower:
    """Exports every rollout that finishes to an OTLP endpoint, from a background thread.

    ``existing=True`` also exports the rollouts already finished at start. A batch the
    endpoint refuses is kept (up to 10,000 rollouts) and retried on the next round.
    """

    def __init__(
        self,
        source: Source,
        endpoint: str | OtlpExporter,
        *,
        existing: bool = False,
        filters: Filters | None = None,
        poll_s: float = 1.0,
    ) -> None:
        self.exporter = endpoint if isinstance(endpoint, OtlpExporter) else OtlpExporter(endpoint)
        self.source = source
        self.filters = filters or Filters()
        self.poll_s = poll_s
        self.exported = 0
        """Rollouts exported so far."""
        self.last_error: str | None = None
        self._pending: list[HeadInfo] = []
        self._tracker = Tracker(source, on_finished=self._collect, report_existing=existing)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False

    @property
    def pending(self) -> int:
        """Finished rollouts not exported yet (the endpoint refused them)."""
        return len(self._pending)

    def _collect(self, heads: list[HeadInfo]) -> None:
        self._pending += heads

    def step(self) -> int:
        """One round: catch up with the source and export what finished; returns how many
        rollouts were exported."""
        self._tracker.refresh()
        todo = [h for h in self._pending if self.filters.matches(h)]
        self._pending = []
        done = 0
        for i in range(0, len(todo), _BATCH):
            chunk = todo[i : i + _BATCH]
            try:
                self.exporter.export(rollouts_of(self.source, chunk))
            except BoltrlError as e:
                self.last_error = str(e)
                log.warning("OTLP export of %d rollouts failed (%s); will retry", len(chunk), e)
                self._pending = (todo[i:] + self._pending)[:_MAX_PENDING]
                break
            done += len(chunk)
        self.exported += done
        return done

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            except Exception:
                log.exception("OTLP follower: could not read the store; retrying")
            self._stop.wait(self.poll_s)

    def start(self) -> OtlpFollower:
        self._thread = threading.Thread(target=self._run, name="boltrl-otlp-follow", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop following (after a last round) and release the exporter. Idempotent."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
            self._thread = None
            try:
                self.step()
            except Exception:
                log.exception("OTLP follower: last round failed")
        if not self._closed:
            self._closed = True
            self.exporter.close()


def follow_store(store: Store, endpoint: str) -> OtlpFollower:
    """Start exporting each rollout of ``store`` that finishes from now on (what ``boltrl
    store serve --otlp`` runs); ``stop()`` it before closing the store."""
    from boltrl.dashboard.source import source_for

    return OtlpFollower(source_for(store), endpoint).start()
