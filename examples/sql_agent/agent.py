"""A text-to-SQL agent in LangGraph: a writer drafts SQL, a checker runs it and reviews it.

Ordinary LangGraph code; the one boltrl line is the callback handler passed with the
graph's ``invoke``. The graph has two nodes, which are the two roles boltrl records
each model call under (the node name is the agent name):

    START → writer → checker ─┬─ approved, or 3 drafts written ──► END
               ▲              │
               └── rewrite ───┘

- ``writer`` writes one SQLite query for the question, given the database schema; asked
  for a rewrite, it sees its previous draft and the checker's feedback (the same
  conversation, continued).
- ``checker`` runs the draft on the database (read-only, time-limited) and shows the
  model the question, the query and its result or error; the model answers ``CORRECT``
  or says what is wrong. A query that fails is always sent back.

The reward is execution match of the last draft with the gold query (``reward.py``).

Run it on its own against any OpenAI-compatible server:

    python examples/sql_agent/agent.py --base-url http://localhost:8000/v1 --model NAME
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any, TypedDict

from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph

import boltrl
from boltrl_langchain import BoltrlCallbackHandler

# The example's own modules, importable as the `sql_agent` package however this file is
# loaded (`python agent.py`, `boltrl train`, a test) without clashing with another
# example's `reward.py`.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sql_agent.reward import QueryError, execute, execution_match

DATA = Path(__file__).resolve().parent / "data"
MAX_DRAFTS = 3
"""The writer writes at most this many queries per question."""
PREVIEW_ROWS = 5
"""Result rows the checker shows the model."""

WRITER_PROMPT = (
    "You are an expert in SQLite. Given a database schema and a question, write one "
    "SQLite query that answers the question. Reply with only the query, in a ```sql "
    "code block."
)
CHECKER_PROMPT = (
    "You review SQLite queries. Given a question, a query and what the query returned, "
    "reply CORRECT if the query answers the question. Otherwise reply WRONG and say in "
    "one sentence what to fix."
)


class State(TypedDict):
    question: str
    schema: str
    db_path: str
    messages: list[BaseMessage]
    """The writer's conversation so far."""
    sql: str | None
    """The latest draft (None: the writer's reply held no query)."""
    feedback: str | None
    """What the checker sends back to the writer."""
    approved: bool
    drafts: int


def extract_sql(text: str) -> str | None:
    """The query in a model reply: the first code block, else from the first SELECT/WITH."""
    block = re.search(r"```(?:sql|sqlite)?\s*\n?(.*?)(?:```|$)", text, re.DOTALL | re.IGNORECASE)
    body = block.group(1) if block else text
    start = re.search(r"\b(SELECT|WITH)\b", body, re.IGNORECASE)
    if start is None:
        return None
    sql = body[start.start() :].split(";")[0].strip()
    return sql or None


@lru_cache(maxsize=64)
def schema_of(db_path: str) -> str:
    """The database's CREATE TABLE statements."""
    rows = execute(db_path, "SELECT sql FROM sqlite_master WHERE type = 'table' AND sql != ''")
    return "\n".join(r[0].strip() + ";" for r in rows if r[0])


def db_path_of(task: dict[str, Any]) -> str:
    """The task's database: ``db_path`` if given, else ``data/database/{db_id}/{db_id}.sqlite``."""
    if task.get("db_path"):
        return str(DATA / task["db_path"])  # an absolute db_path stays as it is
    return str(DATA / "database" / task["db_id"] / f"{task['db_id']}.sqlite")


def _preview(db_path: str, sql: str | None) -> tuple[str, bool]:
    """What the checker shows the model, and whether the query ran."""
    if sql is None:
        return "Error: the reply contained no SQL query.", False
    try:
        rows = execute(db_path, sql)
    except QueryError as e:
        return f"Error: {e}", False
    shown = "\n".join(str(r) for r in rows[:PREVIEW_ROWS])
    more = f"\n... ({len(rows)} rows in all)" if len(rows) > PREVIEW_ROWS else ""
    return f"Result:\n{shown or '(no rows)'}{more}", True


def build_graph(model: ChatOpenAI) -> Any:
    """The writer/checker graph around ``model`` (compiled)."""

    def writer(state: State) -> dict[str, Any]:
        messages = state["messages"] or [
            SystemMessage(WRITER_PROMPT),
            HumanMessage(f"Schema:\n{state['schema']}\n\nQuestion: {state['question']}"),
        ]
        if state["feedback"]:
            messages = [*messages, HumanMessage(state["feedback"])]
        reply = model.invoke(messages)
        return {
            "messages": [*messages, reply],
            "sql": extract_sql(str(reply.content)),
            "drafts": state["drafts"] + 1,
        }

    def checker(state: State) -> dict[str, Any]:
        outcome, ran = _preview(state["db_path"], state["sql"])
        review = model.invoke(
            [
                SystemMessage(CHECKER_PROMPT),
                HumanMessage(
                    f"Question: {state['question']}\n\nQuery:\n{state['sql'] or '(none)'}"
                    f"\n\n{outcome}"
                ),
            ]
        )
        verdict = str(review.content).strip()
        approved = ran and re.match(r"\W*correct\b", verdict, re.IGNORECASE) is not None
        feedback = f"{outcome}\n\nReviewer: {verdict}\n\nWrite a corrected query."
        return {"approved": approved, "feedback": feedback}

    def route(state: State) -> str:
        return END if state["approved"] or state["drafts"] >= MAX_DRAFTS else "writer"

    graph = StateGraph(State)
    graph.add_node("writer", writer)
    graph.add_node("checker", checker)
    graph.add_edge(START, "writer")
    graph.add_edge("writer", "checker")
    graph.add_conditional_edges("checker", route, ["writer", END])
    return graph.compile()


def solve(task: dict[str, Any], llm: boltrl.LLM) -> State:
    """Run the graph on one task; the final state holds the last draft (``sql``)."""
    model = ChatOpenAI(
        model=llm.model,
        base_url=llm.base_url,
        api_key=llm.api_key,
        temperature=llm.temperature,
        top_p=llm.top_p,
        max_tokens=llm.max_tokens or 256,  # type: ignore[call-arg]
    )
    db_path = db_path_of(task)
    state: State = {
        "question": task["question"],
        "schema": schema_of(db_path),
        "db_path": db_path,
        "messages": [],
        "sql": None,
        "feedback": None,
        "approved": False,
        "drafts": 0,
    }
    out: State = build_graph(model).invoke(
        state,
        config={"callbacks": [BoltrlCallbackHandler()]},  # the one boltrl line
    )
    return out


def agent(task: dict[str, Any], llm: boltrl.LLM) -> float:
    """boltrl's agent contract: solve the task, return the execution-match reward."""
    final = solve(task, llm)
    return execution_match(final["sql"], str(task["query"]), final["db_path"])


def main() -> None:
    p = argparse.ArgumentParser(
        description="Run the SQL agent against an OpenAI-compatible server."
    )
    p.add_argument("--base-url", required=True, help="e.g. http://localhost:8000/v1")
    p.add_argument("--model", required=True, help="the served model's name")
    p.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", "none"))
    p.add_argument("--tasks", type=Path, default=DATA / "val.jsonl", help="a task file (JSONL)")
    p.add_argument("--limit", type=int, default=5, help="first N tasks (default 5)")
    args = p.parse_args()
    llm = boltrl.LLM(base_url=args.base_url, model=args.model, api_key=args.api_key, temperature=0)
    tasks = [json.loads(x) for x in args.tasks.read_text().splitlines() if x.strip()]
    total = 0.0
    for task in tasks[: args.limit]:
        final = solve(task, llm)
        reward = execution_match(final["sql"], task["query"], final["db_path"])
        total += reward
        print(f"[{reward:.0f}] {task['question']}\n    {final['sql']}  ({final['drafts']} drafts)")
    print(f"mean reward {total / max(min(args.limit, len(tasks)), 1):.3f}")


if __name__ == "__main__":
    main()
