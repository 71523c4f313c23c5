"""calc_agent's teacher for the warm start: plays the solver from a training task's gold data.

``boltrl sft`` / a ``warm_start:`` section with ``teacher: teacher.py:teach`` runs the real
AutoGen agent with this function in the model's place: the first call gets the calculator
call with the task's ``solution`` expression, the call after the calculator's result gets
``Answer: <gold number>``. boltrl renders both in the student's chat template and token
ids, exactly as the student's own next prompt will hold them. Only training tasks ever
reach it (boltrl enforces that). A task without a solution expression (a GSM8K record)
is answered directly.
"""

from __future__ import annotations

from typing import Any


def _number(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def teach(task: dict[str, Any], request: Any) -> str | dict[str, Any]:
    """The solver's reply at this point of the conversation (``request.messages``)."""
    answer = task["answer"]
    if isinstance(answer, str):  # a raw GSM8K record: "... #### 72"
        answer = answer.rsplit("####", 1)[-1].strip().replace(",", "")
    tool_results = [m for m in request.messages if m.get("role") == "tool"]
    if not tool_results and task.get("solution"):
        return {
            "tool_calls": [{"name": "calculator", "arguments": {"expression": task["solution"]}}]
        }
    return f"Answer: {_number(answer)}"
