"""Load task sets for training and evaluation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from boltrl.errors import InvalidInput
from boltrl.loading import load_object
from boltrl.records import Task


def _to_task(item: Any, where: str, split: str | None) -> Task:
    if isinstance(item, Task):
        return item
    if not isinstance(item, dict):
        raise InvalidInput(f"{where}: each task must be a JSON object (got {type(item).__name__})")
    if "input" in item and isinstance(item["input"], dict):
        # a serialized Task: {"id", "input", "group"?, ...}
        try:
            return Task.model_validate({"split": split, **item})
        except Exception as e:
            raise InvalidInput(f"{where}: not a valid task: {e}") from e
    tid = item.get("id")
    return (
        Task(id=str(tid), input=item, split=split)
        if tid is not None
        else Task(input=item, split=split)
    )


def load_tasks(source: str, *, split: str | None = None) -> list[Task]:
    """Tasks from a ``.jsonl`` / ``.json`` file or a ``module:function`` returning a list.

    Plain objects become the task input (their ``id`` field, if any, the task id); objects
    with an ``input`` object are read as serialized ``Task`` records. Ids must be unique.
    """
    items: list[Any]
    path = Path(source)
    if source.endswith((".jsonl", ".json")):
        if not path.is_file():
            raise InvalidInput(f"task file {source} does not exist")
        text = path.read_text()
        if source.endswith(".jsonl"):
            items = []
            for n, line in enumerate(text.splitlines(), 1):
                if line.strip():
                    try:
                        items.append(json.loads(line))
                    except json.JSONDecodeError as e:
                        raise InvalidInput(f"{source}:{n}: invalid JSON: {e}") from e
        else:
            loaded = json.loads(text)
            if not isinstance(loaded, list):
                raise InvalidInput(f"{source}: expected a JSON list of tasks")
            items = loaded
    else:
        fn = load_object(source, what="tasks")
        items = list(fn() if callable(fn) else fn)
    tasks = [_to_task(it, f"{source}[{i}]", split) for i, it in enumerate(items)]
    seen: set[str] = set()
    for t in tasks:
        if t.id in seen:
            raise InvalidInput(f"{source}: duplicate task id {t.id!r}")
        seen.add(t.id)
    if not tasks:
        raise InvalidInput(f"{source}: no tasks")
    return tasks
