"""Agents for the ``boltrl serve`` tests (loaded by file path from their configs)."""

from __future__ import annotations

from typing import Any

from openai import OpenAI

from boltrl.records import LLM


def answers(task: dict[str, Any], llm: LLM) -> float:
    """1.0 whenever the model answers at all: a gate on which a policy that cannot
    answer (its calls fail) scores 0 and any working one scores 1."""
    client = OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    client.chat.completions.create(
        model=llm.model,
        messages=[{"role": "user", "content": f"What is {task['a']} + {task['b']}?"}],
        **llm.sampling,
    )
    return 1.0
