"""Multi-hop question answering with the OpenAI Agents SDK: BM25 search over a local
corpus, then an answer.

Ordinary Agents SDK code; the one boltrl line is the trace processor, which records
which agent made each model call and every search. It *replaces* the SDK's default
processor, so no trace is uploaded anywhere. Under ``boltrl train`` / ``boltrl eval`` the
``agent`` function is called once per task with the rollout's endpoint; on its own it
runs against any OpenAI-compatible server:

    python examples/rag_agent/agent.py --base-url http://localhost:8000/v1 --model NAME
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import agents
import bm25s
from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool
from agents.exceptions import MaxTurnsExceeded, ModelBehaviorError
from data import as_task, load_corpus
from openai import AsyncOpenAI
from reward import GOLD_DOC_REWARD, answer_f1

import boltrl
from boltrl_openai_agents import BoltrlTracingProcessor

agents.set_trace_processors([BoltrlTracingProcessor()])

HERE = Path(__file__).resolve().parent
TOP_K = 3
MAX_TURNS = 6

INSTRUCTIONS = (
    "You answer questions about people, companies, cities and countries. Use the search "
    "tool to look things up, one name at a time: answering takes two searches, the second "
    "about what the first one found. When you know the answer, reply with only the answer "
    "(a name or a word), nothing else."
)


class Index:
    """BM25 (``bm25s``) over a list of ``{"id", "title", "text"}`` documents."""

    def __init__(self, docs: list[dict[str, str]]) -> None:
        self.docs = docs
        self.bm25 = bm25s.BM25()
        texts = [f"{d['title']} {d['text']}" for d in docs]
        self.bm25.index(
            bm25s.tokenize(texts, stopwords="en", show_progress=False), show_progress=False
        )

    def search(self, query: str, k: int = TOP_K) -> list[dict[str, str]]:
        tokens = bm25s.tokenize([query], stopwords="en", return_ids=False, show_progress=False)
        if not tokens[0]:
            return []
        found, scores = self.bm25.retrieve(tokens, k=min(k, len(self.docs)), show_progress=False)
        return [self.docs[int(i)] for i, s in zip(found[0], scores[0], strict=True) if s > 0]


_indexes: dict[str, Index] = {}
_indexes_lock = threading.Lock()


def corpus_index(path: str) -> Index:
    """The shared corpus' index, built once per process (rollouts run concurrently)."""
    with _indexes_lock:
        if path not in _indexes:
            _indexes[path] = Index(load_corpus(HERE / path))
        return _indexes[path]


def index_for(task: dict[str, Any]) -> Index:
    return Index(task["documents"]) if "documents" in task else corpus_index(task["corpus"])


async def agent(task: dict[str, Any], llm: boltrl.LLM) -> float:
    """Answer one question; the reward is the answer's token F1 against the gold answers
    (plus ``GOLD_DOC_REWARD``, emitted once per supporting document the search finds)."""
    task = as_task(task)
    index, gold, found = index_for(task), set(task["supporting"]), set()

    @function_tool
    def search(query: str) -> str:
        """Search the encyclopedia; returns the best matching documents."""
        docs = index.search(query)
        for doc in docs:
            if doc["id"] in gold and doc["id"] not in found:
                found.add(doc["id"])
                boltrl.emit_reward(GOLD_DOC_REWARD, name="gold_doc")
        return "\n".join(f"{d['title']}: {d['text']}" for d in docs) or "No results."

    client = AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key)
    researcher = Agent(
        name="researcher",
        instructions=INSTRUCTIONS,
        tools=[search],
        model=OpenAIChatCompletionsModel(model=llm.model, openai_client=client),
    )
    try:
        result = await Runner.run(researcher, task["question"], max_turns=MAX_TURNS)
    except (MaxTurnsExceeded, ModelBehaviorError):
        return 0.0  # kept searching, or called a tool that does not exist: no answer
    finally:
        await client.close()
    return answer_f1(str(result.final_output), task["answers"])


def main() -> None:
    p = argparse.ArgumentParser(description="Run rag_agent against an OpenAI-compatible server.")
    p.add_argument("--base-url", required=True, help="e.g. http://localhost:8000/v1")
    p.add_argument("--model", required=True)
    p.add_argument("--api-key", default="none")
    p.add_argument("--tasks", type=Path, default=HERE / "data" / "val.jsonl")
    p.add_argument("--limit", type=int, default=5)
    args = p.parse_args()
    llm = boltrl.LLM(base_url=args.base_url, model=args.model, api_key=args.api_key)
    lines = args.tasks.read_text().splitlines()[: args.limit]
    rewards = []
    for line in lines:
        task = as_task(json.loads(line))
        reward = asyncio.run(agent(task, llm))
        rewards.append(reward)
        print(f"{reward:.2f}  {task['question']}  (gold: {task['answers'][0]})")
    print(f"mean reward {sum(rewards) / max(len(rewards), 1):.3f} over {len(rewards)} tasks")


if __name__ == "__main__":
    main()
