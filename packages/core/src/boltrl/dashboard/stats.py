"""Run statistics kept incrementally: reward mean/spread per (run, phase, step),
throughput, failures, and the set of unfinished rollouts.

A finished rollout never changes again, so ``Tracker`` reads each rollout's head once
when it first appears and again only while it is unfinished: after the first load a
refresh costs O(new + unfinished rollouts), whatever the size of the store. Finished
rollouts are folded into running sums and forgotten.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from boltrl.dashboard.model import STATUSES, Group, HeadInfo, Source

_PAGE = 5000
_THROUGHPUT_POINTS = 240
"""Minutes of throughput history sent per run."""
_RECENT_S = 300.0
"""Window of the "rollouts/min now" rate."""

RunKey = tuple[str | None, str | None, int | None]


@dataclass
class _Acc:
    """Sums over the finished rollouts of one (run, phase, step)."""

    finished: Counter[str] = field(default_factory=Counter)
    n: int = 0
    total: float = 0.0
    squares: float = 0.0
    low: float = math.inf
    high: float = -math.inf

    def add(self, g: Group) -> None:
        self.finished[g.status] += g.n
        if g.rewards:
            self.n += g.rewards
            self.total += g.total
            self.squares += g.squares
            self.low = min(self.low, math.inf if g.low is None else g.low)
            self.high = max(self.high, -math.inf if g.high is None else g.high)

    def json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"n": self.n, **{s: self.finished[s] for s in self.finished}}
        if self.n:
            mean = self.total / self.n
            var = max(0.0, self.squares / self.n - mean * mean)
            out |= {"mean": mean, "std": math.sqrt(var), "min": self.low, "max": self.high}
        return out


@dataclass
class _Run:
    steps: dict[tuple[str | None, int | None], _Acc] = field(default_factory=dict)
    minutes: Counter[int] = field(default_factory=Counter)
    failures: Counter[str] = field(default_factory=Counter)
    first: float = math.inf
    last: float = 0.0


@dataclass(frozen=True)
class Change:
    """What one refresh saw."""

    changed: list[str]
    """Rollouts that appeared or changed status (at most 500 ids)."""
    finished: list[HeadInfo]
    """Rollouts that finished since the last refresh."""
    counts: dict[str, int]
    """Rollouts by status, over the whole store."""


class Tracker:
    """Follows a ``Source`` and keeps the run statistics (see the module docstring).

    ``on_finished`` is called (from the refreshing thread) with the rollouts that
    finished since the last refresh; the first refresh reports the rollouts already
    finished only when ``report_existing``. Thread-safe.
    """

    def __init__(
        self,
        source: Source,
        *,
        on_finished: Callable[[list[HeadInfo]], None] | None = None,
        report_existing: bool = True,
    ) -> None:
        self.source = source
        self._on_finished = on_finished
        self._report_existing = report_existing
        self._lock = threading.RLock()
        self._token: object = object()
        self._loaded = False
        self._cursor = 0
        self._active: dict[str, HeadInfo] = {}
        self._runs: dict[str | None, _Run] = {}
        self._finished: Counter[str] = Counter()

    def refresh(self) -> Change | None:
        """Catch up with the source; None when nothing changed (its change token is the
        same as last time)."""
        with self._lock:
            token = self.source.change_token()
            if token == self._token:
                return None
            self._token = token
            summarize = getattr(self.source, "summarize", None)
            quiet = self._on_finished is None or not self._report_existing
            if not self._loaded and summarize is not None and quiet:
                # A store that can sum finished rollouts itself spares listing them all.
                groups, active, self._cursor = summarize()
                for g in groups:
                    self._fold(g)
                self._active = {h.id: h for h in active}
                self._loaded = True
                return Change([], [], self._counts())
            seen: list[HeadInfo] = []
            while True:
                batch = self.source.heads_after(self._cursor, _PAGE)
                seen += batch
                if batch:
                    self._cursor = batch[-1].ord
                if len(batch) < _PAGE:
                    break
            fresh = {h.id for h in seen}
            seen += self.source.heads_of([i for i in self._active if i not in fresh])
            change = self._apply(seen)
            first, self._loaded = not self._loaded, True
        if self._on_finished is not None and change.finished:
            if not first or self._report_existing:
                self._on_finished(change.finished)
        return change

    def _apply(self, heads: list[HeadInfo]) -> Change:
        changed: list[str] = []
        finished: list[HeadInfo] = []
        for h in heads:
            old = self._active.get(h.id)
            if old is None or old.status != h.status or old.attempts != h.attempts:
                changed.append(h.id)
            if not h.terminal:
                self._active[h.id] = h
                continue
            self._active.pop(h.id, None)
            finished.append(h)
            self._fold(Group.of(h))
        return Change(changed[:500], finished, self._counts())

    def _counts(self) -> dict[str, int]:
        counts = Counter(self._finished)
        counts.update(h.status for h in self._active.values())
        return {s: counts[s] for s in STATUSES}

    def _fold(self, g: Group) -> None:
        self._finished[g.status] += g.n
        run = self._runs.setdefault(g.run, _Run())
        run.steps.setdefault((g.phase, g.step), _Acc()).add(g)
        if g.first:
            run.first = min(run.first, g.first)
        if g.last is not None:
            run.last = max(run.last, g.last)
        if g.minute is not None:
            run.minutes[g.minute] += g.n
        if g.status != "succeeded":
            run.failures[g.error_kind or g.status] += g.n

    @property
    def active(self) -> list[HeadInfo]:
        with self._lock:
            return list(self._active.values())

    def runs(self, now: float | None = None) -> dict[str, Any]:
        """The runs view: per run its counts, reward curves, throughput and failures."""
        now = time.time() if now is None else now
        with self._lock:
            live: dict[str | None, Counter[str]] = {}
            for h in self._active.values():
                live.setdefault(h.run, Counter())[h.status] += 1
                run = self._runs.setdefault(h.run, _Run())
                run.first = min(run.first, h.created_at)
            out = [
                self._run_json(name, run, live.get(name, Counter()), now)
                for name, run in self._runs.items()
            ]
            totals = Counter(self._finished)
            totals.update(h.status for h in self._active.values())
        out.sort(key=lambda r: -r["last_activity"])
        return {"now": now, "counts": {s: totals[s] for s in STATUSES}, "runs": out}

    def _run_json(
        self, name: str | None, run: _Run, live: Counter[str], now: float
    ) -> dict[str, Any]:
        counts: Counter[str] = Counter(live)
        for acc in run.steps.values():
            counts.update(acc.finished)
        steps = [
            {"phase": phase, "step": step, **acc.json()}
            for (phase, step), acc in sorted(
                run.steps.items(), key=lambda kv: (str(kv[0][0]), kv[0][1] is None, kv[0][1] or 0)
            )
        ]
        recent = sum(n for m, n in run.minutes.items() if m * 60 >= now - _RECENT_S)
        minutes = sorted(run.minutes.items())[-_THROUGHPUT_POINTS:]
        span = run.last - run.first if run.last - run.first >= 60.0 else 0.0
        total_finished = sum(run.minutes.values())
        return {
            "name": name,
            "counts": {s: counts[s] for s in STATUSES},
            "steps": steps,
            "throughput": [[m * 60, n] for m, n in minutes],
            "rate_recent": recent / (_RECENT_S / 60.0),
            "rate_overall": total_finished / (span / 60.0) if span > 0 else None,
            "failures": dict(run.failures.most_common()),
            "first": None if math.isinf(run.first) else run.first,
            "last_activity": max(run.last, 0.0 if math.isinf(run.first) else run.first),
        }
