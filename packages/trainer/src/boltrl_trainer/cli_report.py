"""The console ``Reporter`` of ``boltrl train`` / ``eval`` / ``demo`` / ``sft``: event lines
on stdout, a live progress bar per rollout phase on stderr. CLI code: it prints."""

from __future__ import annotations

import sys
import time

from boltrl_trainer.reporting import ProgressBar

__all__ = ["ConsoleReporter"]


class _Bar:
    """A one-line live progress bar on stderr (plain text when not a terminal)."""

    def __init__(self, label: str, total: int, *, enabled: bool) -> None:
        self.label = label
        self.total = total
        self.enabled = enabled
        self.started = time.monotonic()
        self._tty = sys.stderr.isatty()
        self._last = -1.0

    def update(self, done: int, extra: str = "", *, final: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not final and not self._tty and now - self._last < 5.0:
            return  # a log file gets a line every 5 s, not a redraw per tick
        self._last = now
        width = 24
        filled = int(width * done / max(self.total, 1))
        bar = "#" * filled + "-" * (width - filled)
        line = f"{self.label} [{bar}] {done}/{self.total} {now - self.started:5.1f}s {extra}"
        if self._tty:
            sys.stderr.write("\r" + line.ljust(100) + ("\n" if final else ""))
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()


class ConsoleReporter:
    """The CLI's ``Reporter``: event lines on stdout, live progress bars on stderr
    (``progress=False``: no bars)."""

    def __init__(self, *, progress: bool = True) -> None:
        self.show_progress = progress

    def line(self, text: str) -> None:
        print(text, flush=True)

    def progress(self, label: str, total: int) -> ProgressBar:
        return _Bar(label, total, enabled=self.show_progress)
