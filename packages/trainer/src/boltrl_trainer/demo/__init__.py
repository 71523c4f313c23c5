"""The ``boltrl demo`` task: two-digit addition, answered as a number.

Chosen because SmolLM2-135M-Instruct starts low but not at zero on it: it sometimes
knows the sum but mostly wraps it in words or restates the problem ("78 + 55 = 133"). A
bare correct number scores 1, a correct number in words 0.5. A few minutes of GRPO on a
CPU make it restate and add far more often (held-out 0.133 -> ~0.27-0.31), well beyond
run-to-run noise; it does not learn the bare format, since it almost never samples a
bare correct sum (benchmarks/README.md, "What the strict reward lets RL reach").
``lenient_agent`` rewards the sum alone, words or not. The agent is ordinary
code: the official OpenAI client pointed at the rollout's ``base_url``.
"""

from __future__ import annotations

import random
import re
from typing import Any

from boltrl.records import LLM, Task

PROMPT = "What is {a} + {b}? Reply with only the number."


def make_tasks(n: int, *, seed: int, split: str) -> list[Task]:
    """``n`` distinct addition problems with both operands in 10..99."""
    rng = random.Random(f"{split}-{seed}")
    seen: set[tuple[int, int]] = set()
    out: list[Task] = []
    while len(out) < n:
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        if (a, b) in seen:
            continue
        seen.add((a, b))
        out.append(Task(id=f"{split}-{a}+{b}", input={"a": a, "b": b}, split=split))
    return out


def train_tasks() -> list[Task]:
    return make_tasks(256, seed=0, split="train")


def val_tasks() -> list[Task]:
    # disjoint from train: different generator stream, and any overlap removed
    train = {(t.input["a"], t.input["b"]) for t in train_tasks()}
    return [
        t for t in make_tasks(96, seed=1, split="val") if (t.input["a"], t.input["b"]) not in train
    ][:64]


_NUMBER = re.compile(r"-?\d+")


def score(reply: str, answer: int) -> float:
    """1.0 for just the right number ("42", " 42.", "1,042"); 0.5 for the right number
    wrapped in words or working ("The answer is 42.", "12 + 30 = 42"); else 0."""
    text = reply.strip().rstrip(".").replace(",", "").strip()
    if _NUMBER.fullmatch(text) is not None and int(text) == answer:
        return 1.0
    found = _NUMBER.findall(reply.replace(",", ""))
    return 0.5 if found and int(found[-1]) == answer else 0.0


_client: Any = None


def _openai(llm: LLM) -> Any:
    # One HTTP client for all rollouts (its connection pool and TLS setup are costly);
    # each rollout gets a cheap copy bound to its own base_url.
    global _client
    if _client is None:
        from openai import OpenAI

        _client = OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    return _client.with_options(base_url=llm.base_url, api_key=llm.api_key)


def lenient_score(reply: str, answer: int) -> float:
    """1.0 when the reply's last number is the right sum, words or not ("12 + 30 = 42");
    else 0. What a bare GRPO loop usually rewards: arithmetic, not the format."""
    found = _NUMBER.findall(reply.replace(",", ""))
    return 1.0 if found and int(found[-1]) == answer else 0.0


def _ask(task: dict[str, Any], llm: LLM) -> str:
    reply = _openai(llm).chat.completions.create(
        model=llm.model,
        messages=[{"role": "user", "content": PROMPT.format(a=task["a"], b=task["b"])}],
        **llm.sampling,
    )
    return reply.choices[0].message.content or ""


def agent(task: dict[str, Any], llm: LLM) -> float:
    """Ask the model once; reward exact numeric match (``score``)."""
    return score(_ask(task, llm), task["a"] + task["b"])


def lenient_agent(task: dict[str, Any], llm: LLM) -> float:
    """The same question, rewarded by ``lenient_score``:
    ``boltrl demo --set agent=boltrl_trainer.demo:lenient_agent``."""
    return lenient_score(_ask(task, llm), task["a"] + task["b"])


DEMO_CONFIG: dict[str, Any] = {
    "agent": "boltrl_trainer.demo:agent",
    "tasks": {"train": "boltrl_trainer.demo:train_tasks", "val": "boltrl_trainer.demo:val_tasks"},
    "model": "smollm2",
    "algorithm": "grpo",
    "algo": {},
    "steps": 12,
    "batch_tasks": 8,
    "group_size": 8,
    "concurrency": 64,
    "temperature": 0.7,
    "max_tokens": 16,
    "lora": {"r": 16, "alpha": 32},
    # 512-token micro-batches: on a 2-core CPU they update faster than larger ones and keep
    # the demo's peak under 3 GB (benchmarks/README.md, Training: update_bench.py)
    "optim": {"lr": 2e-4, "token_budget": 512},
    "val_every": 6,
    "out_dir": "runs/demo",
}
"""What ``boltrl demo`` trains with (any field can be overridden with ``--set``)."""
