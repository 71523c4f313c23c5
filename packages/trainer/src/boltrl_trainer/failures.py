"""Failures that explain themselves: what went wrong in a phase's rollouts, in a few lines.

The runner files each failed attempt's cause in the store (``Attempt.error_kind`` and
the error text: the agent's traceback, "agent returned str; expected a float reward or
None", a timeout…). ``boltrl train`` and ``boltrl eval`` read the finished rollouts
back and hand the user one line per distinct error through their reporter::

    step 1/4: failed 6/6 rollouts:
      6x exception  ValueError: no such key 'prompt' (agent.py:12 in agent)  e.g. ro-3f…

Rollouts are grouped by error kind and the error's class (``ValueError``; the text
before the first ``:`` of a one-line error), so six tasks that fail the same way
with six different messages make one line, which shows the first message met.

A rollout that succeeded although the agent returned None and emitted no reward is
"silent": training scores it 0 under every credit mode, which is rarely what the
author meant, so the phase says so (``silent_rollouts``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from boltrl.errors import BoltrlError
from boltrl.records import Rollout, RolloutStatus

__all__ = [
    "AllRolloutsFailed",
    "FailureGroup",
    "failure_lines",
    "silent_line",
    "silent_rollouts",
    "summarize_failures",
]

_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<fn>.+)$')
_MAX_MESSAGE = 200
"""Characters of an error's message a summary line shows."""


@dataclass(frozen=True)
class FailureGroup:
    """Failed rollouts that failed the same way."""

    kind: str
    """The attempt's ``error_kind`` (``exception``, ``bad_return``, ``timeout``…), or the
    rollout's status when it has none (``cancelled``)."""
    message: str
    """The first such rollout's error, as one line (with where an exception was raised)."""
    rollout_id: str
    """The first such rollout: ``boltrl export`` / the dashboard show it in full."""
    count: int
    """How many rollouts of the phase failed this way."""

    def line(self) -> str:
        return f"{self.count}x {self.kind}  {self.message}  e.g. {self.rollout_id}"

    def as_json(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "message": self.message,
            "rollout_id": self.rollout_id,
            "count": self.count,
        }


class AllRolloutsFailed(BoltrlError):
    """Every rollout of a phase failed, so there is nothing to train on or to score.
    The message is the phase's failure summary."""


def _headline(text: str) -> tuple[str, str]:
    """(class, one-line message) of an error text: the last line of a traceback with the
    innermost frame's place, or the text itself."""
    lines = [x for x in text.strip().splitlines() if x.strip()]
    if not lines:
        return "", "(no error text)"
    last = lines[-1].strip()
    where = ""
    if len(lines) > 1 and lines[0].startswith("Traceback"):
        frames = [m for m in map(_FRAME.match, lines) if m is not None]
        if frames:
            f = frames[-1]
            where = f" ({f['file'].rsplit('/', 1)[-1]}:{f['line']} in {f['fn'].strip()})"
    head = last.split(":", 1)[0] if ":" in last else last
    if len(last) > _MAX_MESSAGE:
        last = last[: _MAX_MESSAGE - 1] + "…"
    return head, last + where


def _kind(r: Rollout) -> str:
    if r.attempts and r.attempts[-1].error_kind:
        return r.attempts[-1].error_kind
    return r.status.value


def summarize_failures(rollouts: Sequence[Rollout]) -> list[FailureGroup]:
    """The rollouts that did not succeed, grouped (see the module docstring), most
    frequent first; empty when none failed."""
    groups: dict[tuple[str, str], FailureGroup] = {}
    for r in rollouts:
        if r.status == RolloutStatus.SUCCEEDED:
            continue
        kind = _kind(r)
        text = r.error or (r.attempts[-1].error if r.attempts else None) or ""
        head, message = _headline(text) if text else ("", f"rollout {r.status.value}")
        key = (kind, head)
        g = groups.get(key)
        if g is None:
            groups[key] = FailureGroup(kind, message, r.id, 1)
        else:
            groups[key] = FailureGroup(g.kind, g.message, g.rollout_id, g.count + 1)
    return sorted(groups.values(), key=lambda g: -g.count)


def failure_lines(label: str, rollouts: Sequence[Rollout], *, limit: int = 5) -> list[str]:
    """``label: failed k/n`` and one indented line per distinct error (at most ``limit``,
    then how many more kinds); empty when nothing failed."""
    groups = summarize_failures(rollouts)
    if not groups:
        return []
    failed = sum(g.count for g in groups)
    out = [f"{label}: failed {failed}/{len(rollouts)} rollouts:"]
    out.extend(f"  {g.line()}" for g in groups[:limit])
    if len(groups) > limit:
        rest = groups[limit:]
        out.append(f"  … {len(rest)} more kinds of error ({sum(g.count for g in rest)} rollouts)")
    return out


def silent_rollouts(rollouts: Sequence[Rollout]) -> list[Rollout]:
    """Succeeded rollouts whose agent returned None and emitted no reward in the attempt
    that decided them: scored 0 without the agent saying so."""
    out = []
    for r in rollouts:
        if r.status != RolloutStatus.SUCCEEDED or r.reward is not None:
            continue
        attempt = r.final_attempt
        if not any(e.attempt == attempt for e in r.rewards):
            out.append(r)
    return out


def silent_line(label: str, rollouts: Sequence[Rollout]) -> str | None:
    """A warning line about ``silent_rollouts``, or None when there are none."""
    silent = silent_rollouts(rollouts)
    if not silent:
        return None
    return (
        f"{label}: warning: {len(silent)}/{len(rollouts)} rollouts returned None and emitted "
        f"no reward, so they score 0 (return a float or call boltrl.emit_reward); "
        f"e.g. {silent[0].id}"
    )
