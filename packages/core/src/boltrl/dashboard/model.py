"""What the dashboard reads from a store: compact per-rollout facts, filters, and the
``Source`` contract its data sources (SQL on a SQLite file, or any ``Store``) keep."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from boltrl.records import Rollout

TERMINAL = ("succeeded", "failed", "cancelled")
ACTIVE = ("queued", "requeued", "running")
STATUSES = ("queued", "requeued", "running", "succeeded", "failed", "cancelled")


class HeadInfo(NamedTuple):
    """The few fields of a rollout head (no records) that tables and charts need.

    A named tuple: a refresh builds one per rollout, and tuples build fastest."""

    ord: int
    """Enqueue order (1-based); newer rollouts have larger values."""
    id: str
    status: str
    task_id: str
    run: str | None
    """``task.metadata["run"]`` as the trainer tags it (None when untagged)."""
    phase: str | None
    """``task.metadata["phase"]`` (``train`` or ``val``), else ``task.split``."""
    step: int | None
    """``task.metadata["step"]`` (None when untagged or not an integer)."""
    split: str | None
    group: str | None
    reward: float | None
    """The rollout's score (``boltrl.scoring.rollout_score`` under the default credit: its
    returned reward, else what its ``emit_reward`` events add up to); None unless it
    succeeded."""
    created_at: float
    started_at: float | None
    """Start of the first attempt."""
    finished_at: float | None
    attempts: int
    worker: str | None
    """Worker of the last attempt."""
    error_kind: str | None
    """Error kind of the last attempt."""

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    @property
    def duration(self) -> float | None:
        if self.started_at is None or self.finished_at is None:
            return None
        return max(0.0, self.finished_at - self.started_at)


class Group(NamedTuple):
    """Finished rollouts that share run, phase, step, status, error kind and the minute
    they finished in, summed: what a store can aggregate instead of listing rollouts."""

    run: str | None
    phase: str | None
    step: int | None
    status: str
    error_kind: str | None
    minute: int | None
    """``finished_at // 60``."""
    n: int
    rewards: int
    """How many of them have a reward."""
    total: float
    squares: float
    low: float | None
    high: float | None
    first: float | None
    """Earliest start (first attempt, else creation)."""
    last: float | None
    """Latest finish."""

    @classmethod
    def of(cls, h: HeadInfo) -> Group:
        r = h.reward
        minute = None if h.finished_at is None else int(h.finished_at // 60)
        return cls(
            h.run, h.phase, h.step, h.status, h.error_kind, minute, 1,
            0 if r is None else 1, r or 0.0, (r or 0.0) ** 2, r, r,
            h.started_at or h.created_at, h.finished_at,
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class Filters:
    """Rollout table filters; None (or empty) means no filter on that field."""

    status: tuple[str, ...] = ()
    run: str | None = None
    agent: str | None = None
    """An agent named by the rollout's adapter annotations or tool steps."""
    task: str | None = None
    """Exact task id."""

    def matches(self, h: HeadInfo) -> bool:
        """True when ``h`` passes every filter but ``agent`` (which needs records)."""
        if self.status and h.status not in self.status:
            return False
        if self.run is not None and h.run != self.run:
            return False
        return self.task is None or h.task_id == self.task


@dataclass(slots=True)
class RecordFacts:
    """What a rollout's records add to its table row."""

    agents: list[str] = field(default_factory=list)
    """Agent names of the rollout's calls, annotations and tool steps."""
    named: list[str] = field(default_factory=list)
    """Agent names that adapter annotations and tool steps give (what the agent filter
    matches: the gateway's own call records carry no agent)."""
    policy_versions: list[int] = field(default_factory=list)
    calls: int = 0
    tool_steps: int = 0
    rewards: int = 0


@dataclass(frozen=True, slots=True)
class AttemptInfo:
    """One attempt as the workers view needs it."""

    rollout_id: str
    worker: str
    outcome: str
    started_at: float
    last_heartbeat: float
    lease_expires_at: float
    ended_at: float | None


class Source(Protocol):
    """Where the dashboard reads from. Thread-safe; every method returns promptly.

    ``ord`` is the enqueue order: ``heads_after(0)`` lists every rollout.
    """

    label: str
    """What the page header shows as the store (a path or URL, never a token)."""

    def heads_after(self, cursor: int, limit: int) -> list[HeadInfo]:
        """Rollouts with ``ord > cursor``, oldest first, at most ``limit``."""
        ...

    def heads_of(self, ids: Sequence[str]) -> list[HeadInfo]:
        """The current heads of these rollouts (unknown ids are left out)."""
        ...

    def page(self, filters: Filters, limit: int, offset: int) -> tuple[list[HeadInfo], int]:
        """One page of the rollouts matching ``filters``, newest first, and their total."""
        ...

    def facts(self, ids: Sequence[str]) -> dict[str, RecordFacts]:
        """Record facts (agents, policy versions, counts) of these rollouts."""
        ...

    def agents(self) -> list[str]:
        """Every agent name seen in any rollout's records, sorted."""
        ...

    def get(self, rollout_id: str) -> Rollout:
        """The whole rollout with its records (raises ``NotFound``)."""
        ...

    def group_rewards(self, head: HeadInfo) -> list[float]:
        """Scores of the finished rollouts in ``head``'s advantage group (same group or
        task, same run, phase and step), ``head`` included."""
        ...

    def recent_attempts(self, rollouts: int) -> list[AttemptInfo]:
        """Attempts of the newest ``rollouts`` rollouts and of every running one."""
        ...

    def live_workers(self) -> list[dict[str, Any]] | None:
        """The store's own view of its workers (``worker_id``, ``last_seen``,
        ``running``), or None when the store keeps none."""
        ...

    def change_token(self) -> object:
        """A cheap value that changes whenever the store may have changed."""
        ...

    def close(self) -> None: ...
