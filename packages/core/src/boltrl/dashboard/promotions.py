"""The Promotions page's data: the decision log ``boltrl serve`` appends to
(``{out_dir}/promotions.jsonl``, one JSON object per gate decision: ``promote``,
``rollback`` or ``initial``, with the figures that decided it).

The log lives beside the store rather than in it: a decision is not a rollout's record,
and the store's records are defined once, for rollouts. The dashboard reads the file on
each request (it is small: one line per learner round) and never writes it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["promotions_view"]

_SHOWN = 500
"""Most decisions returned (the newest); older ones stay in the file."""


def promotions_view(path: Path | None) -> dict[str, Any]:
    """``{"path", "available", "decisions": [...oldest first...], "total"}``; a line that
    is not a JSON object (a write torn by a crash) is skipped and counted in ``skipped``."""
    if path is None:
        return {"path": None, "available": False, "decisions": [], "total": 0, "skipped": 0}
    decisions: list[dict[str, Any]] = []
    skipped = 0
    if path.is_file():
        for line in path.read_text(errors="replace").splitlines():
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError:
                skipped += 1
                continue
            if isinstance(item, dict):
                decisions.append(item)
            else:
                skipped += 1
    return {
        "path": str(path),
        "available": path.is_file(),
        "decisions": decisions[-_SHOWN:],
        "total": len(decisions),
        "skipped": skipped,
    }
