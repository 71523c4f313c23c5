"""Unit-conversion word problems, built deterministically; or your own question/answer file.

Shipped data (``python examples/dspy_program/data.py``, seed 0): templated problems in
four levels of difficulty, each with an exact numeric answer —

- ``one-step``: one conversion by a whole factor (3 m → 300 cm);
- ``decimal``: one conversion with a decimal answer (1,250 mL → 1.25 L);
- ``two-step``: two chained conversions (2.5 h → 9,000 s);
- ``word``: arithmetic on quantities, then a conversion (750 m there and back for 4 days
  → 6 km).

They are split train/val/test per level, no question in two splits.

Your own data (``--from FILE``): a JSONL file (or a JSON list) of objects with a question
and an answer — the public format of most QA sets, e.g. GSM8K's ``{"question",
"answer": "…#### 42"}`` (the text after ``####`` is the answer) — written as task files
with the metric named in each task (``--metric numeric|exact``, see ``reward.py``), split
by ``--split-sizes``.

A task: ``{"id", "question", "answer" (str), "metric", "level"}``.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DATA = HERE / "data"
PER_LEVEL = 100
"""Problems per level."""
SPLIT = (0.6, 0.2)
"""Share of each level in train and val; the rest is test."""

# unit -> (dimension, size in the dimension's base unit); exact decimals, no float error
UNITS: dict[str, tuple[str, Decimal]] = {
    "kilometers": ("length", Decimal(1000)),
    "meters": ("length", Decimal(1)),
    "centimeters": ("length", Decimal("0.01")),
    "millimeters": ("length", Decimal("0.001")),
    "kilograms": ("mass", Decimal(1000)),
    "grams": ("mass", Decimal(1)),
    "milligrams": ("mass", Decimal("0.001")),
    "liters": ("volume", Decimal(1)),
    "milliliters": ("volume", Decimal("0.001")),
    "days": ("time", Decimal(86400)),
    "hours": ("time", Decimal(3600)),
    "minutes": ("time", Decimal(60)),
    "seconds": ("time", Decimal(1)),
}
THINGS = {
    "length": ["A rope is {q} {u} long", "A trail is {q} {u} long", "A shelf is {q} {u} wide"],
    "mass": ["A bag of flour weighs {q} {u}", "A parcel weighs {q} {u}", "A cat weighs {q} {u}"],
    "volume": ["A bottle holds {q} {u}", "A bucket holds {q} {u}", "A jug holds {q} {u}"],
    "time": ["A film lasts {q} {u}", "A trip takes {q} {u}", "A class lasts {q} {u}"],
}
NAMES = ["Ana", "Ben", "Chen", "Dara", "Emil", "Farah", "Goran", "Hiro", "Ines", "Jon"]


def fmt(x: Decimal) -> str:
    """A number as people write it: no exponent, no trailing zeros (1.50 → 1.5)."""
    s = f"{x.normalize():f}"
    return s.rstrip("0").rstrip(".") if "." in s else s


def _pair(rng: random.Random, dim: str, *, bigger_to_smaller: bool) -> tuple[str, str]:
    units = sorted((u for u, (d, _) in UNITS.items() if d == dim), key=lambda u: UNITS[u][1])
    i, j = sorted(rng.sample(range(len(units)), 2))
    return (units[j], units[i]) if bigger_to_smaller else (units[i], units[j])


def _convert(q: Decimal, src: str, dst: str) -> Decimal:
    return q * UNITS[src][1] / UNITS[dst][1]


def _one_step(rng: random.Random) -> tuple[str, Decimal]:
    dim = rng.choice(sorted(THINGS))
    src, dst = _pair(rng, dim, bigger_to_smaller=True)
    q = Decimal(rng.randint(2, 12))
    text = rng.choice(THINGS[dim]).format(q=q, u=src)
    return f"{text}. How many {dst} is that?", _convert(q, src, dst)


def _decimal(rng: random.Random) -> tuple[str, Decimal]:
    dim = rng.choice(sorted(THINGS))
    src, dst = _pair(rng, dim, bigger_to_smaller=False)
    factor = UNITS[dst][1] / UNITS[src][1]
    q = factor * Decimal(rng.randint(1, 40)) / 4  # answers in quarters: 0.25, 1.5, 7.75
    text = rng.choice(THINGS[dim]).format(q=fmt(q), u=src)
    return f"{text}. How many {dst} is that?", _convert(q, src, dst)


def _two_step(rng: random.Random) -> tuple[str, Decimal]:
    chains = [
        ("hours", "minutes", "seconds"),
        ("days", "hours", "minutes"),
        ("kilometers", "meters", "centimeters"),
        ("kilograms", "grams", "milligrams"),
    ]
    src, _, dst = rng.choice(chains)
    dim = UNITS[src][0]
    q = Decimal(rng.randint(1, 12)) / 2
    text = rng.choice(THINGS[dim]).format(q=fmt(q), u=src)
    return f"{text}. How many {dst} is that?", _convert(q, src, dst)


def _word(rng: random.Random) -> tuple[str, Decimal]:
    name = rng.choice(NAMES)
    kind = rng.randrange(3)
    if kind == 0:
        d, days = rng.choice([250, 500, 750, 1250]), rng.randint(2, 8)
        q = f"{name} walks {d} meters to school and {d} meters back each day."
        return f"{q} How many kilometers does {name} walk in {days} days?", Decimal(
            2 * d * days
        ) / 1000
    if kind == 1:
        ml, n = rng.choice([200, 250, 330, 500]), rng.randint(2, 12)
        q = f"{name} pours {n} glasses of {ml} milliliters each."
        return f"{q} How many liters is that in total?", Decimal(ml * n) / 1000
    mins, n = rng.choice([15, 30, 45, 90]), rng.randint(2, 10)
    q = f"{name} practises piano for {mins} minutes a day."
    return f"{q} How many hours is that over {n} days?", Decimal(mins * n) / 60


LEVELS: dict[str, Callable[[random.Random], tuple[str, Decimal]]] = {
    "one-step": _one_step,
    "decimal": _decimal,
    "two-step": _two_step,
    "word": _word,
}


def _split(items: list[Any], sizes: tuple[float, float]) -> dict[str, list[Any]]:
    a = round(len(items) * sizes[0])
    b = a + round(len(items) * sizes[1])
    return {"train": items[:a], "val": items[a:b], "test": items[b:]}


def build_tasks(seed: int = 0) -> dict[str, list[dict[str, Any]]]:
    """The shipped problems, split train/val/test."""
    out: dict[str, list[dict[str, Any]]] = {"train": [], "val": [], "test": []}
    seen: set[str] = set()  # a question is in one level and one split only
    for level, make in LEVELS.items():
        rng = random.Random(f"units-{seed}-{level}")
        problems: dict[str, Decimal] = {}
        for _ in range(100 * PER_LEVEL):  # distinct questions; gives up on a small level
            question, answer = make(rng)
            if question not in seen:
                seen.add(question)
                problems[question] = answer
            if len(problems) == PER_LEVEL:
                break
        for split, items in _split(list(problems.items()), SPLIT).items():
            for i, (question, answer) in enumerate(items):
                out[split].append(
                    {
                        "id": f"units-{split}-{level}-{i:03d}",
                        "question": question,
                        "answer": fmt(answer),
                        "metric": "numeric",
                        "level": level,
                    }
                )
    for split, tasks in out.items():
        random.Random(f"units-order-{seed}-{split}").shuffle(tasks)
    return out


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def build(out: Path = DATA, seed: int = 0) -> list[Path]:
    """Write ``train.jsonl``, ``val.jsonl``, ``test.jsonl`` under ``out``."""
    written = []
    for split, tasks in build_tasks(seed).items():
        _write_jsonl(out / f"{split}.jsonl", tasks)
        written.append(out / f"{split}.jsonl")
    return written


def rl_train() -> list[dict[str, Any]]:
    """The shipped training problems except two-step ones, what ``train.yaml``'s RL phase
    samples: a first warm start of SmolLM2-135M answered none of the two-step val problems
    (two conversions folded into one wrong factor), whose GRPO groups would then be all
    wrong and teach nothing. Later warm starts answered some; RL on all four levels from
    the same warm starts gained the same within a problem or two (README), so this is a
    measured choice, not a rule."""
    rows = [json.loads(x) for x in (DATA / "train.jsonl").read_text().splitlines() if x.strip()]
    return [t for t in rows if t["level"] != "two-step"]


def from_file(
    path: Path,
    out: Path,
    *,
    metric: str = "numeric",
    question_field: str = "question",
    answer_field: str = "answer",
    sizes: tuple[float, float] = SPLIT,
    seed: int = 0,
) -> list[Path]:
    """Convert a question/answer file (JSONL or a JSON list) into task files under ``out``.

    An answer containing ``####`` (GSM8K) is the text after it; rows are shuffled with
    ``seed`` and split by ``sizes`` (train, val shares; the rest is test).
    """
    text = path.read_text()
    rows = (
        json.loads(text)
        if path.suffix == ".json"
        else [json.loads(x) for x in text.splitlines() if x.strip()]
    )
    items = []
    for i, row in enumerate(rows):
        answer = str(row[answer_field]).split("####")[-1].strip()
        items.append((i, str(row[question_field]), answer))
    random.Random(f"file-{seed}").shuffle(items)
    written = []
    for split, part in _split(items, sizes).items():
        tasks = [
            {"id": f"{path.stem}-{i:05d}", "question": q, "answer": a, "metric": metric}
            for i, q, a in part
        ]
        _write_jsonl(out / f"{split}.jsonl", tasks)
        written.append(out / f"{split}.jsonl")
    return written


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=0, help="generator seed (default 0)")
    p.add_argument("--out", type=Path, default=None, help="output folder (default data/)")
    p.add_argument("--from", dest="source", type=Path, default=None, help="a QA file to convert")
    p.add_argument("--metric", default="numeric", choices=["numeric", "exact"])
    p.add_argument("--question-field", default="question")
    p.add_argument("--answer-field", default="answer")
    p.add_argument("--split-sizes", type=float, nargs=2, default=SPLIT, metavar=("TRAIN", "VAL"))
    args = p.parse_args()
    if args.source is not None:
        files = from_file(
            args.source,
            args.out or DATA / args.source.stem,
            metric=args.metric,
            question_field=args.question_field,
            answer_field=args.answer_field,
            sizes=tuple(args.split_sizes),
            seed=args.seed,
        )
    else:
        files = build(args.out or DATA, args.seed)
    for f in files:
        print(f)


if __name__ == "__main__":
    main()
