"""Arithmetic word problems solved by an AutoGen AgentChat assistant with a calculator tool.

Ordinary AutoGen code; the one boltrl line is ``boltrl_autogen.instrument()``, which
records which agent made each model call and every calculator run. Under ``boltrl train``
/ ``boltrl eval`` the ``agent`` function is called once per task with the rollout's
endpoint; on its own it runs against any OpenAI-compatible server:

    python examples/calc_agent/agent.py --base-url http://localhost:8000/v1 --model NAME
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import json
import operator
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

from autogen_agentchat.agents import AssistantAgent
from autogen_core.models import ModelInfo
from autogen_ext.models.openai import OpenAIChatCompletionClient
from data import gold_answer
from reward import exact_match

import boltrl
import boltrl_autogen

boltrl_autogen.instrument()

SYSTEM_MESSAGE = (
    "You solve arithmetic word problems. Use the calculator tool for the arithmetic: "
    "give it one expression, such as 4 * 12 + 7. When you know the result, reply with "
    "'Answer: <number>'."
)

MODEL_INFO = ModelInfo(
    vision=False,
    function_calling=True,
    json_output=False,
    family="unknown",
    structured_output=False,
)

# --------------------------------------------------------------------------- the tool

_OPS: dict[type, Callable[..., Fraction]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}
_SYMBOLS = str.maketrans({"\u00d7": "*", "\u00f7": "/", ",": None})  # x, divide, 1,000
_MAX_LEN = 200
_MAX_MAGNITUDE = Fraction(10) ** 30


def _eval(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return Fraction(str(node.value))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and (right.denominator != 1 or abs(right) > 12):
            raise ValueError("exponents must be whole numbers between -12 and 12")
        if isinstance(node.op, ast.Div | ast.FloorDiv | ast.Mod) and right == 0:
            raise ValueError("division by zero")
        value = _OPS[type(node.op)](left, right)
        if abs(value) > _MAX_MAGNITUDE:
            raise ValueError("number too large")
        return Fraction(value)
    raise ValueError(f"unsupported syntax: {type(node).__name__}")


def evaluate(expression: str) -> str:
    """The value of an arithmetic expression (+ - * / // % ** and parentheses), exact:
    a whole number, or a decimal rounded to 6 places. Raises ``ValueError`` on anything
    else: names, calls, attributes and the like are never evaluated."""
    if len(expression) > _MAX_LEN:
        raise ValueError(f"expression longer than {_MAX_LEN} characters")
    text = expression.translate(_SYMBOLS).replace("^", "**")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as e:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from e
    value = _eval(tree.body)
    if value.denominator == 1:
        return str(value.numerator)
    return f"{float(value):.6f}".rstrip("0")


async def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression such as 4 * 12 + 7 and return the result."""
    return evaluate(expression)


# --------------------------------------------------------------------------- the agent


async def agent(task: dict[str, Any], llm: boltrl.LLM) -> float:
    """Solve one word problem; the reward is 1.0 for the exact answer, else 0.0."""
    client = OpenAIChatCompletionClient(
        model=llm.model, base_url=llm.base_url, api_key=llm.api_key, model_info=MODEL_INFO
    )
    solver = AssistantAgent(
        "solver",
        model_client=client,
        tools=[calculator],
        system_message=SYSTEM_MESSAGE,
        reflect_on_tool_use=True,
        max_tool_iterations=3,
    )
    try:
        result = await solver.run(task=task["question"])
    finally:
        await client.close()
    return exact_match(result.messages[-1].to_text(), gold_answer(task))


def main() -> None:
    p = argparse.ArgumentParser(description="Run calc_agent against an OpenAI-compatible server.")
    p.add_argument("--base-url", required=True, help="e.g. http://localhost:8000/v1")
    p.add_argument("--model", required=True)
    p.add_argument("--api-key", default="none")
    p.add_argument("--tasks", type=Path, default=Path(__file__).parent / "data" / "val.jsonl")
    p.add_argument("--limit", type=int, default=5)
    args = p.parse_args()
    llm = boltrl.LLM(base_url=args.base_url, model=args.model, api_key=args.api_key)
    lines = args.tasks.read_text().splitlines()[: args.limit]
    rewards = []
    for line in lines:
        task = json.loads(line)
        reward = asyncio.run(agent(task, llm))
        rewards.append(reward)
        print(f"{reward:.0f}  {task['question']}")
    print(f"mean reward {sum(rewards) / max(len(rewards), 1):.3f} over {len(rewards)} tasks")


if __name__ == "__main__":
    main()
