"""A two-predictor DSPy program: ``plan`` writes the steps, ``answer`` follows them.

Ordinary DSPy code; the one boltrl line is the callback passed with ``dspy.context``.
boltrl records each LM call under the predictor that made it (``plan``, ``answer``),
which is the agent name training can select on (``credit.agents``).

The reward is the task's metric on the final answer (``reward.py``); a reply without
DSPy's field markers is read as plain text (``PlainTextFallback``), and an answer with no
number in it scores 0.

Run it on its own against any OpenAI-compatible server:

    python examples/dspy_program/agent.py --base-url http://localhost:8000/v1 --model NAME
"""

from __future__ import annotations

import os

# DSPy's first LM call downloads model metadata unless told to use its local copy.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import dspy
from dspy.utils.exceptions import AdapterParseError

import boltrl
from boltrl_dspy import BoltrlCallback

# The example's own modules, importable as the `dspy_program` package however this file
# is loaded (`python agent.py`, `boltrl train`, a test) without clashing with another
# example's `reward.py`.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dspy_program.reward import score

DATA = Path(__file__).resolve().parent / "data"


class Plan(dspy.Signature):
    """Plan how to solve the problem: list the quantities, the conversion factors and the
    arithmetic to do, one short step per line."""

    question: str = dspy.InputField()
    plan: str = dspy.OutputField(desc="numbered steps")


class Answer(dspy.Signature):
    """Follow the plan to solve the problem. Give the final answer as a number only."""

    question: str = dspy.InputField()
    plan: str = dspy.InputField()
    answer: str = dspy.OutputField(desc="a number, without units")


class PlanAndAnswer(dspy.Module):
    def __init__(self) -> None:
        super().__init__()
        self.plan = dspy.Predict(Plan)
        self.answer = dspy.Predict(Answer)

    def forward(self, question: str) -> dspy.Prediction:
        plan = self.plan(question=question).plan
        return self.answer(question=question, plan=plan)


class PlainTextFallback(dspy.ChatAdapter):
    """DSPy's ChatAdapter that also takes a reply without DSPy's ``[[ ## field ## ]]``
    markers as the value of the signature's only output field: small models often drop
    the markers, and the metric reads the number out of the text anyway."""

    def parse(self, signature: type[dspy.Signature], completion: str) -> dict[str, Any]:
        try:
            return super().parse(signature, completion)
        except AdapterParseError:
            if len(signature.output_fields) != 1:
                raise
            [name] = signature.output_fields
            return {name: completion.replace("[[ ## completed ## ]]", "").strip()}


program = PlanAndAnswer()
# One LM call per predictor: without use_json_adapter_fallback=False, a reply DSPy cannot
# parse is retried with another adapter (JSON): an extra call with a different prompt.
adapter = PlainTextFallback(use_json_adapter_fallback=False)


def make_lm(llm: boltrl.LLM) -> dspy.LM:
    """A DSPy LM on the endpoint ``llm`` names. ``cache=False``: every call reaches the
    model (a cached answer has no tokens to train on)."""
    return dspy.LM(
        f"openai/{llm.model}",
        api_base=llm.base_url,
        api_key=llm.api_key,
        cache=False,
        temperature=llm.temperature,
        max_tokens=llm.max_tokens or 256,
    )


def solve(task: dict[str, Any], llm: boltrl.LLM) -> str | None:
    """The program's answer to the task's question (None: the reply could not be parsed)."""
    with dspy.context(
        lm=make_lm(llm),
        adapter=adapter,
        callbacks=[BoltrlCallback()],  # the one boltrl line
    ):
        try:
            return str(program(question=task["question"]).answer)
        except AdapterParseError:
            return None


def agent(task: dict[str, Any], llm: boltrl.LLM) -> float:
    """boltrl's agent contract: run the program, return the task metric."""
    return score(task, solve(task, llm))


def main() -> None:
    p = argparse.ArgumentParser(description="Run the DSPy program against an OpenAI server.")
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
        answer = solve(task, llm)
        reward = score(task, answer)
        total += reward
        print(f"[{reward:.0f}] {task['question']}\n    -> {answer} (gold {task['answer']})")
    print(f"mean reward {total / max(min(args.limit, len(tasks)), 1):.3f}")


if __name__ == "__main__":
    main()
