"""Multi-hop QA data for ``rag_agent``: a deterministic builder and a MuSiQue reader.

``python data.py`` (re)builds the shipped files in ``data/``: ``corpus.jsonl``, a few
hundred short documents about a fictional world (people, the companies they founded,
cities, countries), and ``train/val/test.jsonl``, 2-hop questions over it (every answer
needs two documents: "In which country was Orla Venndrake born?" needs her document,
which names the city, and the city's, which names the country). The same seed always
writes the same bytes.

``python data.py --musique PATH --out FILE`` converts MuSiQue's public JSONL (one record
per question, with its own 20 paragraphs) into the same task format. The agent also
reads MuSiQue records as they are, so ``tasks.val: /path/to/musique_ans_v1.0_dev.jsonl``
in a config works without converting.

A task is ``{"id", "question", "answers": [...], "supporting": [doc ids], "type"}`` plus
its documents: ``"corpus"`` (a JSONL file of ``{"id", "title", "text"}``, relative to
this folder) or ``"documents"`` (the list itself).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

Task = dict[str, Any]
Doc = dict[str, str]

SPLITS = {"train": 280, "val": 60, "test": 60}
CORPUS = "data/corpus.jsonl"
"""The shipped corpus, relative to this folder (what the shipped tasks name)."""

N_COUNTRIES, N_CITIES, N_PEOPLE, N_COMPANIES = 12, 48, 120, 60

_ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr"]
_ONSETS += ["kr", "st", "th", "tr", "sh", "gl", "fl", "h", "j", "w"]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ei", "ou", "ia", "y"]
_CODAS = ["", "", "n", "r", "l", "s", "m", "th", "nd", "rk", "x"]
PROFESSIONS = [
    "sculptor", "chemist", "novelist", "architect", "violinist", "astronomer",
    "cartographer", "botanist", "engineer", "photographer", "historian", "surgeon",
]  # fmt: skip
INDUSTRIES = [
    "shipping", "textile", "software", "mining", "publishing", "brewing",
    "aviation", "insurance", "robotics", "furniture",
]  # fmt: skip
SUFFIXES = {
    "country": ["ia", "land", "ovia", "istan", "ara", "enia"],
    "city": ["holm", "ford", "mere", "bury", "vale", "port", "grad", "wick"],
    "river": ["a", "en", "is", "or"],
    "currency": ["el", "ar", "ot"],
}


class _Names:
    """Unique, pronounceable fictional names (no name is a word of another)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.used: set[str] = set()

    def stem(self, syllables: int) -> str:
        r = self.rng
        return "".join(r.choice(_ONSETS) + r.choice(_VOWELS) for _ in range(syllables)) + (
            r.choice(_CODAS)
        )

    def make(self, syllables: int, suffix: str = "") -> str:
        while True:
            name = (self.stem(syllables) + suffix).capitalize()
            if name.lower() not in self.used:
                self.used.add(name.lower())
                return name


def build_world(rng: random.Random) -> dict[str, list[dict[str, Any]]]:
    """The fictional world: countries, cities, people and companies, linked by name."""
    names = _Names(rng)
    countries = [
        {
            "name": names.make(2, rng.choice(SUFFIXES["country"])),
            "currency": names.make(1, rng.choice(SUFFIXES["currency"])).lower(),
        }
        for _ in range(N_COUNTRIES)
    ]
    cities = [
        {
            "name": names.make(1 + rng.randrange(2), rng.choice(SUFFIXES["city"])),
            "country": countries[i % N_COUNTRIES]["name"],
            "river": names.make(2, rng.choice(SUFFIXES["river"])),
        }
        for i in range(N_CITIES)
    ]
    for i, country in enumerate(countries):
        country["capital"] = cities[i]["name"]  # cities[i] lies in countries[i]
    people = [
        {
            "name": f"{names.make(1 + rng.randrange(2))} {names.make(2)}",
            "profession": rng.choice(PROFESSIONS),
            "born": rng.choice(cities)["name"],
        }
        for _ in range(N_PEOPLE)
    ]
    founders = rng.sample(people, N_COMPANIES)
    companies = [
        {
            "name": f"{names.make(2)} {rng.choice(['Works', 'Group', 'Labs', 'Company'])}",
            "industry": rng.choice(INDUSTRIES),
            "founder": founder["name"],
            "hq": rng.choice(cities)["name"],
        }
        for founder in founders
    ]
    return {"countries": countries, "cities": cities, "people": people, "companies": companies}


def _a(word: str) -> str:
    return f"an {word}" if word[0] in "aeiou" else f"a {word}"


def _doc_id(kind: str, name: str) -> str:
    return f"{kind}:{name.lower().replace(' ', '-')}"


def corpus(world: dict[str, list[dict[str, Any]]]) -> list[Doc]:
    """One short document per entity."""
    docs = []
    for c in world["countries"]:
        text = f"{c['name']} is a country whose capital is {c['capital']}. "
        text += f"Its currency is the {c['currency']}."
        docs.append({"id": _doc_id("country", c["name"]), "title": c["name"], "text": text})
    for c in world["cities"]:
        text = f"{c['name']} is a city in {c['country']}. It lies on the {c['river']} river."
        docs.append({"id": _doc_id("city", c["name"]), "title": c["name"], "text": text})
    for p in world["people"]:
        text = f"{p['name']} is {_a(p['profession'])} who was born in the city of {p['born']}."
        docs.append({"id": _doc_id("person", p["name"]), "title": p["name"], "text": text})
    for c in world["companies"]:
        text = f"{c['name']} is {_a(c['industry'])} company founded by {c['founder']}. "
        text += f"Its headquarters are in {c['hq']}."
        docs.append({"id": _doc_id("company", c["name"]), "title": c["name"], "text": text})
    return docs


def questions(world: dict[str, list[dict[str, Any]]]) -> list[Task]:
    """Every 2-hop question the world supports (answers and both supporting documents)."""
    city = {c["name"]: c for c in world["cities"]}
    country = {c["name"]: c for c in world["countries"]}
    person = {p["name"]: p for p in world["people"]}
    out: list[Task] = []

    def add(kind: str, question: str, answer: str, docs: list[tuple[str, str]]) -> None:
        out.append(
            {
                "question": question,
                "answers": [answer],
                "supporting": [_doc_id(k, n) for k, n in docs],
                "type": kind,
            }
        )

    for p in world["people"]:
        c = city[p["born"]]
        add(
            "birth_country",
            f"In which country was {p['name']} born?",
            c["country"],
            [("person", p["name"]), ("city", c["name"])],
        )
        add(
            "birth_river",
            f"On which river lies the city where {p['name']} was born?",
            c["river"],
            [("person", p["name"]), ("city", c["name"])],
        )
    for co in world["companies"]:
        f, c = person[co["founder"]], city[co["hq"]]
        add(
            "hq_country",
            f"In which country are the headquarters of {co['name']}?",
            c["country"],
            [("company", co["name"]), ("city", c["name"])],
        )
        add(
            "founder_birthplace",
            f"In which city was the founder of {co['name']} born?",
            f["born"],
            [("company", co["name"]), ("person", f["name"])],
        )
        add(
            "founder_profession",
            f"What is the profession of the person who founded {co['name']}?",
            f["profession"],
            [("company", co["name"]), ("person", f["name"])],
        )
    capitals = {c["capital"] for c in world["countries"]}
    for c in world["cities"]:
        if c["name"] not in capitals:
            add(
                "capital",
                f"What is the capital of the country where {c['name']} is?",
                country[c["country"]]["capital"],
                [("city", c["name"]), ("country", c["country"])],
            )
    return out


def build(seed: int = 0) -> tuple[list[Doc], dict[str, list[Task]]]:
    """The corpus and each split's tasks (disjoint questions over the shared corpus)."""
    rng = random.Random(seed)
    world = build_world(rng)
    pool = questions(world)
    rng.shuffle(pool)
    splits: dict[str, list[Task]] = {}
    start = 0
    for split, n in SPLITS.items():
        items = pool[start : start + n]
        start += n
        splits[split] = [
            {"id": f"rag-{split}-{i:04d}", **q, "corpus": CORPUS} for i, q in enumerate(items)
        ]
    return corpus(world), splits


def _jsonl(rows: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows)


def write(docs: list[Doc], splits: dict[str, list[Task]], out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "corpus.jsonl"]
    paths[0].write_text(_jsonl(list(docs)))
    for split, tasks in splits.items():
        paths.append(out_dir / f"{split}.jsonl")
        paths[-1].write_text(_jsonl(tasks))
    return paths


def load_corpus(path: str | Path) -> list[Doc]:
    """Documents from a JSONL file of ``{"id", "title", "text"}``."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


# --------------------------------------------------------------------------- MuSiQue


def from_musique(record: dict[str, Any]) -> Task:
    """One MuSiQue record (``paragraphs`` with ``is_supporting``, ``answer``,
    ``answer_aliases``) as a task carrying its own documents."""
    docs = [
        {"id": f"p{p['idx']}", "title": p.get("title", ""), "text": p["paragraph_text"]}
        for p in record["paragraphs"]
    ]
    return {
        "id": str(record["id"]),
        "question": record["question"],
        "answers": [record["answer"], *record.get("answer_aliases", [])],
        "supporting": [f"p{p['idx']}" for p in record["paragraphs"] if p.get("is_supporting")],
        "type": "musique",
        "documents": docs,
    }


def load_musique(path: str | Path, *, answerable_only: bool = True) -> list[Task]:
    """Tasks from a MuSiQue JSONL file (``musique_ans_v1.0_train.jsonl``, ``..._dev``, or
    the ``full`` variant, whose unanswerable questions are skipped unless asked for)."""
    records = [json.loads(x) for x in Path(path).read_text().splitlines() if x.strip()]
    return [from_musique(r) for r in records if r.get("answerable", True) or not answerable_only]


def as_task(task: Task) -> Task:
    """A task in this module's format, whether it is one already or a raw MuSiQue record."""
    return from_musique(task) if "paragraphs" in task else task


def main(argv: list[str] | None = None) -> None:
    here = Path(__file__).resolve().parent
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="folder (or file with --musique)")
    p.add_argument("--musique", type=Path, default=None, help="convert this MuSiQue JSONL file")
    args = p.parse_args(argv)
    if args.musique is not None:
        out = args.out or here / "data" / f"{args.musique.stem}.jsonl"
        tasks = load_musique(args.musique)
        out.write_text(_jsonl(tasks))
        print(f"{len(tasks)} tasks -> {out}")
        return
    docs, splits = build(args.seed)
    for path in write(docs, splits, args.out or here / "data"):
        print(path)


if __name__ == "__main__":
    main()
