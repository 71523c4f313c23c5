"""rag_agent's teacher for the warm start: plays the researcher from a training task's gold data.

With ``teacher: teacher.py:teach`` in a ``warm_start:`` section, the real Agents SDK agent
runs with this function in the model's place: one ``search`` call per supporting
document, by its title (the first names what the question names, the second what the first
document names), then the gold answer alone. boltrl renders every reply in the student's
chat template and token ids. Only training tasks ever reach it (boltrl enforces that).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
_titles: dict[str, dict[str, str]] = {}
_lock = threading.Lock()


def _titles_of(task: dict[str, Any]) -> dict[str, str]:
    """Document id -> title for the task's documents (the shared corpus is read once)."""
    if "documents" in task:
        return {d["id"]: d["title"] for d in task["documents"]}
    path = task["corpus"]
    with _lock:
        if path not in _titles:
            lines = (HERE / path).read_text().splitlines()
            docs = [json.loads(line) for line in lines if line.strip()]
            _titles[path] = {d["id"]: d["title"] for d in docs}
        return _titles[path]


def teach(task: dict[str, Any], request: Any) -> str | dict[str, Any]:
    """The researcher's reply at this point of the conversation (``request.messages``)."""
    searched = sum(1 for m in request.messages if m.get("role") == "tool")
    supporting = list(task.get("supporting") or [])
    if searched < len(supporting):
        title = _titles_of(task)[supporting[searched]]
        return {"tool_calls": [{"name": "search", "arguments": {"query": title}}]}
    return str(task["answers"][0])
