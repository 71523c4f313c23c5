"""Arithmetic word problems for ``calc_agent``: a deterministic builder and a GSM8K reader.

``python data.py`` (re)builds the shipped splits in ``data/`` from templated problems of
graded difficulty (``level`` 1: adding or taking away a few, 2: one operation on
bigger numbers, 3: two operations, 4: three); the same seed always
writes the same bytes. ``python data.py --gsm8k PATH --out FILE`` converts GSM8K's public
JSONL (``{"question", "answer": "... #### 72"}``) into the same task format. The agent
also reads GSM8K records as they are, so ``tasks.train: /path/to/gsm8k/train.jsonl`` in a
config works without converting.

A task is ``{"id", "question", "answer": number, "level", "solution"}``; ``solution`` is
an expression whose value is the answer (empty for GSM8K).
"""

from __future__ import annotations

import argparse
import json
import random
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

Task = dict[str, Any]

SPLITS = {"train": 300, "val": 60, "test": 60}
"""Tasks per split, an equal share of each level."""

NAMES = ["Ava", "Ben", "Chloe", "Dev", "Emma", "Farid", "Grace", "Hugo", "Ines", "Jon", "Kai"]
ITEMS = ["apple", "pencil", "sticker", "marble", "book", "cookie", "card", "shell"]


def _level1(r: random.Random) -> tuple[str, str, int]:
    name, item = r.choice(NAMES), r.choice(ITEMS)
    if r.randrange(2):
        a, b = r.randint(2, 20), r.randint(2, 9)
        return (
            f"{name} has {a} {item}s and gets {b} more. How many {item}s does {name} have now?",
            f"{a} + {b}",
            a + b,
        )
    a, b = r.randint(10, 20), r.randint(2, 9)
    return (
        f"{name} had {a} {item}s and lost {b} of them. How many {item}s does {name} have left?",
        f"{a} - {b}",
        a - b,
    )


def _level2(r: random.Random) -> tuple[str, str, int]:
    name, item = r.choice(NAMES), r.choice(ITEMS)
    a, b = r.randint(10, 99), r.randint(10, 99)
    kind = r.randrange(4)
    if kind == 0:
        return (
            f"{name} has {a} {item}s and gets {b} more. How many {item}s does {name} have now?",
            f"{a} + {b}",
            a + b,
        )
    if kind == 1:
        a, b = max(a, b) + 10, min(a, b)
        return (
            f"{name} had {a} {item}s and gave {b} of them away. How many {item}s are left?",
            f"{a} - {b}",
            a - b,
        )
    if kind == 2:
        a, b = r.randint(3, 12), r.randint(3, 25)
        return f"A bag holds {b} {item}s. How many {item}s are in {a} bags?", f"{a} * {b}", a * b
    a, b = r.randint(3, 12), r.randint(3, 25)
    return (
        f"{name} shares {a * b} {item}s equally among {a} friends. "
        f"How many {item}s does each friend get?",
        f"{a * b} / {a}",
        b,
    )


def _level3(r: random.Random) -> tuple[str, str, int]:
    name, item = r.choice(NAMES), r.choice(ITEMS)
    kind = r.randrange(3)
    if kind == 0:
        a, b, c = r.randint(3, 12), r.randint(4, 20), r.randint(5, 60)
        return (
            f"{name} buys {a} packs of {b} {item}s and then {c} loose {item}s. "
            f"How many {item}s does {name} buy in total?",
            f"{a} * {b} + {c}",
            a * b + c,
        )
    if kind == 1:
        a, b, c = r.randint(50, 150), r.randint(10, 49), r.randint(10, 80)
        return (
            f"{name} has {a} {item}s, gives away {b} and then finds {c} more. "
            f"How many {item}s does {name} have now?",
            f"{a} - {b} + {c}",
            a - b + c,
        )
    n, p, q = r.randint(3, 9), r.randint(5, 30), r.randint(2, 15)
    return (
        f"{n} friends each pay {p} dollars for a ticket and {q} dollars for snacks. "
        "How many dollars do they pay altogether?",
        f"{n} * ({p} + {q})",
        n * (p + q),
    )


def _level4(r: random.Random) -> tuple[str, str, int]:
    name = r.choice(NAMES)
    kind = r.randrange(3)
    if kind == 0:
        w, h, d = r.randint(8, 25), r.randint(3, 8), r.randint(3, 6)
        s = r.randint(20, w * h * d - 10)
        return (
            f"{name} earns {w} dollars an hour, works {h} hours a day for {d} days and then "
            f"spends {s} dollars. How many dollars does {name} have left?",
            f"{w} * {h} * {d} - {s}",
            w * h * d - s,
        )
    if kind == 1:
        rows, cols, f = r.randint(3, 12), r.randint(4, 15), r.randint(5, 30)
        e = r.randint(10, rows * cols * f - 10)
        return (
            f"An orchard has {rows} rows of {cols} trees and each tree gives {f} plums. "
            f"If {e} plums are eaten, how many plums are left?",
            f"{rows} * {cols} * {f} - {e}",
            rows * cols * f - e,
        )
    a, p, b, q = r.randint(2, 6), r.randint(8, 30), r.randint(2, 6), r.randint(5, 20)
    t = (a * p + b * q) // 50 * 50 + 50 * r.randint(1, 3)
    return (
        f"{name} buys {a} shirts at {p} dollars each and {b} hats at {q} dollars each, "
        f"paying with {t} dollars. How many dollars of change does {name} get?",
        f"{t} - ({a} * {p} + {b} * {q})",
        t - (a * p + b * q),
    )


LEVELS: dict[int, Callable[[random.Random], tuple[str, str, int]]] = {
    1: _level1,
    2: _level2,
    3: _level3,
    4: _level4,
}


def build(seed: int = 0) -> dict[str, list[Task]]:
    """Every split's tasks, levels interleaved (1, 2, 3, 4, 1, ...) so that any prefix of a
    split (``--limit``, ``tasks.limit_val``) has all levels; questions never repeat across
    splits."""
    rng = random.Random(seed)
    seen: set[str] = set()
    out: dict[str, list[Task]] = {}
    for split, n in SPLITS.items():
        tasks: list[Task] = []
        for _ in range(n // len(LEVELS)):
            for level, make in LEVELS.items():
                question, solution, value = make(rng)
                while question in seen:
                    question, solution, value = make(rng)
                seen.add(question)
                tasks.append(
                    {
                        "id": f"calc-{split}-{len(tasks):04d}",
                        "question": question,
                        "answer": value,
                        "level": level,
                        "solution": solution,
                    }
                )
        out[split] = tasks
    return out


def write(tasks: dict[str, list[Task]], out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for split, items in tasks.items():
        path = out_dir / f"{split}.jsonl"
        path.write_text("".join(json.dumps(t, sort_keys=True) + "\n" for t in items))
        paths.append(path)
    return paths


# --------------------------------------------------------------------------- GSM8K

_GSM8K_FINAL = re.compile(r"####\s*(-?[\d,]*\.?\d+)")


def parse_gsm8k_answer(answer: str) -> int | float:
    """The number after GSM8K's ``####`` marker (``"... #### 1,234"`` → 1234)."""
    m = _GSM8K_FINAL.search(answer)
    if m is None:
        raise ValueError(f"no '#### <number>' in GSM8K answer {answer[-60:]!r}")
    value = float(m.group(1).replace(",", ""))
    return int(value) if value.is_integer() else value


def from_gsm8k(record: dict[str, Any], index: int = 0) -> Task:
    """One GSM8K record as a task."""
    return {
        "id": str(record.get("id", f"gsm8k-{index:05d}")),
        "question": record["question"],
        "answer": parse_gsm8k_answer(record["answer"]),
        "level": None,
        "solution": "",
    }


def load_gsm8k(path: str | Path) -> list[Task]:
    """Tasks from a GSM8K JSONL file (``train.jsonl`` / ``test.jsonl`` of the release)."""
    lines = Path(path).read_text().splitlines()
    return [from_gsm8k(json.loads(line), i) for i, line in enumerate(lines) if line.strip()]


def gold_answer(task: Task) -> int | float:
    """A task's gold number, from our format or a raw GSM8K record."""
    answer = task["answer"]
    return parse_gsm8k_answer(answer) if isinstance(answer, str) else answer


def _shipped_train(levels: tuple[int, ...]) -> list[Task]:
    path = Path(__file__).resolve().parent / "data" / "train.jsonl"
    tasks = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [t for t in tasks if t["level"] in levels]


def easy_train() -> list[Task]:
    """The shipped training tasks of levels 1 and 2: where a small model (SmolLM2-135M)
    starts above zero, so GRPO's groups have rewards to compare (RL without a warm start)."""
    return _shipped_train((1, 2))


def hard_train() -> list[Task]:
    """The shipped training tasks of levels 3 and 4: after the warm start every level-1 and
    level-2 task is right, so their GRPO groups have all-equal rewards and teach nothing;
    RL's rollouts go where the model is sometimes right."""
    return _shipped_train((3, 4))


def hard_train_with_level2() -> list[Task]:
    """The shipped training tasks of levels 2, 3 and 4: ``hard_train`` plus level 2, whose
    groups have equal rewards while the model still solves them and mixed ones once RL
    starts to lose them, so GRPO sees (and pushes back on) forgetting there."""
    return _shipped_train((2, 3, 4))


def main(argv: list[str] | None = None) -> None:
    here = Path(__file__).resolve().parent
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="folder (or file with --gsm8k)")
    p.add_argument("--gsm8k", type=Path, default=None, help="convert this GSM8K JSONL file")
    args = p.parse_args(argv)
    if args.gsm8k is not None:
        out = args.out or here / "data" / f"gsm8k_{args.gsm8k.stem}.jsonl"
        tasks = load_gsm8k(args.gsm8k)
        out.write_text("".join(json.dumps(t, sort_keys=True) + "\n" for t in tasks))
        print(f"{len(tasks)} tasks -> {out}")
        return
    for path in write(build(args.seed), args.out or here / "data"):
        print(path)


if __name__ == "__main__":
    main()
