"""Where long work reports to a person: lines and live progress, through a reporter.

Library code never prints. The trainer, ``boltrl eval`` and the rollout session hand
their one-line events (a step's summary, a validation score, a resume) and their live
progress to a ``Reporter``. ``boltrl train`` / ``eval`` / ``demo`` hand in one that
writes to the terminal (``boltrl_trainer.cli_train.ConsoleReporter``); anything else
gets ``LogReporter``, which logs.
"""

from __future__ import annotations

import logging
from typing import Protocol

__all__ = ["LogReporter", "ProgressBar", "Reporter"]

log = logging.getLogger("boltrl_trainer")


class ProgressBar(Protocol):
    """The live progress of one rollout phase.

    Promises: ``update`` may be called from any one thread at a time, often (every half
    second); it must not raise and must not block for long.
    """

    def update(self, done: int, extra: str = "", *, final: bool = False) -> None:
        """``done`` of the phase's total are finished; ``final`` once, at the end."""
        ...


class Reporter(Protocol):
    """Receives a long run's events. Promises: never raises; may block briefly (to write
    a line); called from the loop's thread, and the bars it hands out from another."""

    def line(self, text: str) -> None:
        """One finished event (a step, a validation, a resume), as a line of text."""
        ...

    def progress(self, label: str, total: int) -> ProgressBar:
        """A bar for a phase of ``total`` rollouts called ``label``."""
        ...


class _LogBar:
    def __init__(self, label: str, total: int) -> None:
        self.label, self.total = label, total

    def update(self, done: int, extra: str = "", *, final: bool = False) -> None:
        if final:  # a log gets the outcome, not every tick
            log.info("%s: %d/%d %s", self.label, done, self.total, extra)


class LogReporter:
    """Lines and each phase's outcome go to the ``boltrl_trainer`` logger at INFO."""

    def line(self, text: str) -> None:
        log.info("%s", text)

    def progress(self, label: str, total: int) -> ProgressBar:
        return _LogBar(label, total)
