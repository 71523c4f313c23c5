"""sql_agent's teacher for the warm start: plays both roles from a training task's gold SQL.

With ``teacher: teacher.py:teach`` in a ``warm_start:`` section, the real LangGraph agent runs
with this function in the model's place: the writer's call gets the gold query in a
```` ```sql ```` block, the checker's call gets ``CORRECT`` (the query it reviews is the gold
one, and it ran). boltrl renders both replies in the student's chat template and token ids;
with ``credit.agents: [writer]`` only the writer's calls are trained on, as in RL. Only
training tasks ever reach it (boltrl enforces that).
"""

from __future__ import annotations

from typing import Any

_CHECKER_MARK = "You review SQLite queries"
"""How the checker's system prompt begins (``agent.CHECKER_PROMPT``)."""


def teach(task: dict[str, Any], request: Any) -> str:
    """The writer's or the checker's reply, told apart by the system prompt."""
    system = str(request.messages[0].get("content") or "")
    if system.startswith(_CHECKER_MARK):
        return "CORRECT"
    return f"```sql\n{task['query']}\n```"
