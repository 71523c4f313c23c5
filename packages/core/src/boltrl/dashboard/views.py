"""The rollouts table and the workers view, as JSON for the pages."""

from __future__ import annotations

import time
from typing import Any

from boltrl.dashboard.model import AttemptInfo, Filters, HeadInfo, RecordFacts, Source

_WINDOW_S = 300.0
"""Throughput window of the workers view (rollouts/min over the last five minutes)."""
_RECENT_ROLLOUTS = 2000
"""How many of the newest rollouts the workers view derives attempts from."""


def row(h: HeadInfo, f: RecordFacts | None) -> dict[str, Any]:
    """One rollouts-table row."""
    f = f or RecordFacts()
    return {
        "id": h.id,
        "status": h.status,
        "task_id": h.task_id,
        "run": h.run,
        "phase": h.phase,
        "step": h.step,
        "reward": h.reward,
        "attempts": h.attempts,
        "duration": h.duration,
        "created_at": h.created_at,
        "started_at": h.started_at,
        "finished_at": h.finished_at,
        "worker": h.worker,
        "error_kind": h.error_kind,
        "agents": f.agents,
        "policy_versions": sorted(f.policy_versions),
        "calls": f.calls,
        "tool_steps": f.tool_steps,
    }


def rollouts_page(source: Source, filters: Filters, limit: int, offset: int) -> dict[str, Any]:
    heads, total = source.page(filters, limit, offset)
    facts = source.facts([h.id for h in heads])
    return {
        "rows": [row(h, facts.get(h.id)) for h in heads],
        "total": total,
        "limit": limit,
        "offset": offset,
    }


def workers_view(source: Source, now: float | None = None) -> dict[str, Any]:
    """Runners with their last sign of life, current rollouts and recent throughput:
    the store's own view of workers where it keeps one, joined with what the attempts
    of recent rollouts say."""
    now = time.time() if now is None else now
    by: dict[str, dict[str, Any]] = {}

    def entry(worker: str) -> dict[str, Any]:
        return by.setdefault(
            worker,
            {
                "worker_id": worker,
                "last_seen": 0.0,
                "running": [],
                "lease_expires_at": None,
                "finished_recent": 0,
                "failed_recent": 0,
                "attempts": 0,
            },
        )

    attempts: list[AttemptInfo] = source.recent_attempts(_RECENT_ROLLOUTS)
    for a in attempts:
        w = entry(a.worker)
        w["attempts"] += 1
        w["last_seen"] = max(w["last_seen"], a.last_heartbeat, a.ended_at or 0.0)
        if a.outcome == "running":
            if a.rollout_id not in w["running"]:
                w["running"].append(a.rollout_id)
            w["lease_expires_at"] = max(w["lease_expires_at"] or 0.0, a.lease_expires_at)
        elif a.ended_at is not None and a.ended_at >= now - _WINDOW_S:
            w["finished_recent"] += 1
            if a.outcome != "succeeded":
                w["failed_recent"] += 1
    for live in source.live_workers() or []:
        w = entry(str(live["worker_id"]))
        w["last_seen"] = max(w["last_seen"], float(live["last_seen"]))
        for rid in live.get("running", []):
            if rid not in w["running"]:
                w["running"].append(rid)
    out = []
    for w in by.values():
        w["rate"] = w["finished_recent"] / (_WINDOW_S / 60.0)
        w["state"] = _state(w, now)
        out.append(w)
    out.sort(key=lambda w: (w["state"] != "busy", -w["last_seen"]))
    return {"now": now, "window_s": _WINDOW_S, "workers": out}


def _state(w: dict[str, Any], now: float) -> str:
    if w["running"]:
        lease = w["lease_expires_at"]
        return "late" if lease is not None and lease < now else "busy"
    return "idle" if now - w["last_seen"] < _WINDOW_S else "gone"
