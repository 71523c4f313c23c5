"""The text-to-SQL dataset: a small shop database and question/SQL pairs, or Spider.

Shipped data (``python examples/sql_agent/data.py``, seed 0) is built here,
deterministically: a SQLite database (``data/database/shop/shop.sqlite``: customers,
suppliers, products, orders, order_items) filled from a seeded generator, and a few
hundred questions with their gold SQL in four levels of difficulty (Spider's easy /
medium / hard / extra: one table → joins, grouping, nesting), split train/val/test per
level. A question whose gold result is empty or whose ``ORDER BY … LIMIT`` answer is
tied is left out, so every gold answer is unambiguous.

Spider (``--spider DIR``: the unpacked release with ``train_spider.json``, ``dev.json``,
``database/``; ``test.json`` + ``test_database/`` if present) is converted to the same
task format, each task naming its database by absolute path; point ``tasks.train`` /
``tasks.val`` at the written files.

A task: ``{"id", "question", "query" (gold SQL), "db_id", "difficulty"}`` and, for
databases outside ``data/database``, ``"db_path"``.
"""

from __future__ import annotations

import argparse
import json
import random
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DATA = HERE / "data"
LEVELS = ("easy", "medium", "hard", "extra")
PER_LEVEL = {"easy": 100, "medium": 100, "hard": 80, "extra": 60}
"""Questions kept per difficulty level (fewer when a level has fewer candidates)."""
SPLIT = (0.7, 0.15)
"""Share of each level in train and val; the rest is test."""

SCHEMA = """
CREATE TABLE customers (
  customer_id INTEGER PRIMARY KEY,
  name TEXT NOT NULL,
  city TEXT NOT NULL,
  country TEXT NOT NULL,
  joined_year INTEGER NOT NULL
);
CREATE TABLE suppliers (
  supplier_id INTEGER PRIMARY KEY,
  name TEXT NOT NULL,
  country TEXT NOT NULL
);
CREATE TABLE products (
  product_id INTEGER PRIMARY KEY,
  name TEXT NOT NULL,
  category TEXT NOT NULL,
  price REAL NOT NULL,
  supplier_id INTEGER NOT NULL REFERENCES suppliers (supplier_id)
);
CREATE TABLE orders (
  order_id INTEGER PRIMARY KEY,
  customer_id INTEGER NOT NULL REFERENCES customers (customer_id),
  order_date TEXT NOT NULL,
  status TEXT NOT NULL
);
CREATE TABLE order_items (
  order_id INTEGER NOT NULL REFERENCES orders (order_id),
  product_id INTEGER NOT NULL REFERENCES products (product_id),
  quantity INTEGER NOT NULL,
  PRIMARY KEY (order_id, product_id)
);
"""

FIRST = "Ada Ben Cara Dev Eli Fay Gus Hana Ivo Jun Kai Lea Milo Nia Omar Pia Raj Sol Tess Uma"
LAST = "Berg Costa Diaz Evans Fox Gray Hill Ito Khan Lund Moss Novak Ortiz Park Reyes Shaw"
CITIES = {
    "Lisbon": "Portugal",
    "Porto": "Portugal",
    "Madrid": "Spain",
    "Seville": "Spain",
    "Lyon": "France",
    "Paris": "France",
    "Berlin": "Germany",
    "Munich": "Germany",
    "Oslo": "Norway",
    "Bergen": "Norway",
}
SUPPLIERS = [
    ("Acme Trading", "Germany"),
    ("Blue River", "France"),
    ("Cedar & Co", "Spain"),
    ("Delta Goods", "Portugal"),
    ("Evergreen Supply", "Norway"),
    ("Fjord Imports", "Norway"),
    ("Granite Works", "Germany"),
    ("Harbor Line", "Spain"),
]
PRODUCTS = {
    "Books": "Atlas Cookbook Diary Novel Poetry Album",
    "Electronics": "Camera Charger Headphones Keyboard Speaker Tablet",
    "Garden": "Hose Planter Rake Shovel Sprinkler Trowel",
    "Kitchen": "Blender Kettle Pan Teapot Toaster Whisk",
    "Sports": "Ball Helmet Racket Skates Tent Yoga-Mat",
    "Toys": "Blocks Kite Puzzle Robot Top Yo-Yo",
}
ADJECTIVES = "Classic Deluxe Mini Pro"
STATUSES = ("delivered", "shipped", "pending", "cancelled")
YEARS = (2021, 2022, 2023, 2024)


# -- the database --------------------------------------------------------------------


def build_database(path: Path, seed: int) -> None:
    """Create the shop database at ``path`` (replacing it) from ``seed``."""
    rng = random.Random(f"shop-db-{seed}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    names = [f"{f} {la}" for f in FIRST.split() for la in LAST.split()]
    customers = []
    for i, name in enumerate(rng.sample(names, 60), 1):
        city = rng.choice(sorted(CITIES))
        customers.append((i, name, city, CITIES[city], rng.randint(2015, 2023)))
    suppliers = [(i, n, c) for i, (n, c) in enumerate(SUPPLIERS, 1)]
    products: list[tuple[int, str, str, float, int]] = []
    for category, nouns in PRODUCTS.items():
        for noun in nouns.split():
            name = f"{rng.choice(ADJECTIVES.split())} {noun}"
            price = round(rng.uniform(2, 300), 2)
            products.append((len(products) + 1, name, category, price, rng.randint(1, 8)))
    orders: list[tuple[int, int, str, str]] = []
    items: list[tuple[int, int, int]] = []
    # a few customers and products are left out of every order ("never ordered" questions)
    buyers = [c[0] for c in customers][:-4]
    sold = [p[0] for p in products][:-3]
    for oid in range(1, 301):
        date = f"{rng.choice(YEARS)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
        weights = (6, 2, 1, 1)
        status = rng.choices(STATUSES, weights)[0]
        orders.append((oid, rng.choice(buyers), date, status))
        for pid in sorted(rng.sample(sold, rng.randint(1, 4))):
            items.append((oid, pid, rng.randint(1, 5)))
    with sqlite3.connect(path) as db:
        db.executescript(SCHEMA)
        db.executemany("INSERT INTO customers VALUES (?, ?, ?, ?, ?)", customers)
        db.executemany("INSERT INTO suppliers VALUES (?, ?, ?)", suppliers)
        db.executemany("INSERT INTO products VALUES (?, ?, ?, ?, ?)", products)
        db.executemany("INSERT INTO orders VALUES (?, ?, ?, ?)", orders)
        db.executemany("INSERT INTO order_items VALUES (?, ?, ?)", items)
    db.close()


# -- questions -----------------------------------------------------------------------

Pair = tuple[str, str]
"""(question, gold SQL)."""

_JOIN_ORDERS = (
    "FROM orders AS T1 JOIN order_items AS T2 ON T1.order_id = T2.order_id "
    "JOIN products AS T3 ON T2.product_id = T3.product_id "
    "JOIN customers AS T4 ON T1.customer_id = T4.customer_id"
)


def _q(s: str) -> str:
    return s.replace("'", "''")


def _easy(v: dict[str, list[Any]]) -> Iterator[Pair]:
    for table in ("customers", "suppliers", "products", "orders"):
        yield f"How many {table} are there?", f"SELECT count(*) FROM {table}"
    for city in v["cities"]:
        yield (
            f"How many customers live in {city}?",
            f"SELECT count(*) FROM customers WHERE city = '{city}'",
        )
    for cat in v["categories"]:
        yield (
            f"List the names of all products in the {cat} category.",
            f"SELECT name FROM products WHERE category = '{cat}'",
        )
    for p in v["products"]:
        yield f"What is the price of the {p}?", f"SELECT price FROM products WHERE name = '{_q(p)}'"
    for x in (50, 100, 150, 200, 250):
        yield (
            f"What are the names of the products that cost more than {x} dollars?",
            f"SELECT name FROM products WHERE price > {x}",
        )
    for s in STATUSES:
        yield (
            f"How many orders have the status '{s}'?",
            f"SELECT count(*) FROM orders WHERE status = '{s}'",
        )
    for y in range(2015, 2024):
        yield (
            f"What are the names of the customers who joined in {y}?",
            f"SELECT name FROM customers WHERE joined_year = {y}",
        )
    for c in v["customers"]:
        yield f"Which city does {c} live in?", f"SELECT city FROM customers WHERE name = '{_q(c)}'"
    for country in v["countries"]:
        yield (
            f"What are the names of the suppliers based in {country}?",
            f"SELECT name FROM suppliers WHERE country = '{country}'",
        )


def _medium(v: dict[str, list[Any]]) -> Iterator[Pair]:
    for cat in v["categories"]:
        yield (
            f"What is the average price of the products in the {cat} category?",
            f"SELECT avg(price) FROM products WHERE category = '{cat}'",
        )
        for word, order in (("most expensive", "DESC"), ("cheapest", "ASC")):
            yield (
                f"What is the name of the {word} product in the {cat} category?",
                f"SELECT name FROM products WHERE category = '{cat}' "
                f"ORDER BY price {order} LIMIT 1",
            )
        for x in (50, 100):
            yield (
                f"Which products in the {cat} category cost less than {x} dollars?",
                f"SELECT name FROM products WHERE category = '{cat}' AND price < {x}",
            )
    yield (
        "How many customers are there in each city?",
        "SELECT city, count(*) FROM customers GROUP BY city",
    )
    yield (
        "How many products are there in each category?",
        "SELECT category, count(*) FROM products GROUP BY category",
    )
    yield (
        "How many orders are there for each status?",
        "SELECT status, count(*) FROM orders GROUP BY status",
    )
    yield (
        "What is the highest product price in each category?",
        "SELECT category, max(price) FROM products GROUP BY category",
    )
    for c in v["customers"]:
        yield (
            f"How many orders has {c} placed?",
            "SELECT count(*) FROM orders AS T1 JOIN customers AS T2 "
            f"ON T1.customer_id = T2.customer_id WHERE T2.name = '{_q(c)}'",
        )
    for s in v["suppliers"]:
        yield (
            f"What are the names of the products supplied by {s}?",
            "SELECT T1.name FROM products AS T1 JOIN suppliers AS T2 "
            f"ON T1.supplier_id = T2.supplier_id WHERE T2.name = '{_q(s)}'",
        )
    for y in YEARS:
        yield (
            f"How many orders were placed in {y}?",
            f"SELECT count(*) FROM orders WHERE order_date LIKE '{y}-%'",
        )
    for n in (3, 5):
        yield (
            f"What are the names of the {n} most expensive products?",
            f"SELECT name FROM products ORDER BY price DESC LIMIT {n}",
        )


def _hard(v: dict[str, list[Any]]) -> Iterator[Pair]:
    for p in v["products"]:
        yield (
            f"What is the total quantity of the {p} that has been ordered?",
            "SELECT sum(T1.quantity) FROM order_items AS T1 JOIN products AS T2 "
            f"ON T1.product_id = T2.product_id WHERE T2.name = '{_q(p)}'",
        )
    for n in (4, 5, 6, 7, 8):
        yield (
            f"What are the names of the customers who have placed more than {n} orders?",
            "SELECT T2.name FROM orders AS T1 JOIN customers AS T2 "
            f"ON T1.customer_id = T2.customer_id GROUP BY T1.customer_id HAVING count(*) > {n}",
        )
    yield (
        "What are the names of the products that have never been ordered?",
        "SELECT name FROM products WHERE product_id NOT IN (SELECT product_id FROM order_items)",
    )
    yield (
        "What are the names of the customers who have never placed an order?",
        "SELECT name FROM customers WHERE customer_id NOT IN (SELECT customer_id FROM orders)",
    )
    for city in v["cities"]:
        yield (
            f"How many different customers from {city} have placed an order?",
            "SELECT count(DISTINCT T1.customer_id) FROM orders AS T1 JOIN customers AS T2 "
            f"ON T1.customer_id = T2.customer_id WHERE T2.city = '{city}'",
        )
    for x in (80, 120, 160):
        yield (
            f"Which categories have an average product price above {x} dollars?",
            f"SELECT category FROM products GROUP BY category HAVING avg(price) > {x}",
        )
    for country in v["countries"]:
        for cat in v["categories"]:
            yield (
                f"Which suppliers from {country} supply products in the {cat} category?",
                "SELECT DISTINCT T2.name FROM products AS T1 JOIN suppliers AS T2 "
                f"ON T1.supplier_id = T2.supplier_id "
                f"WHERE T2.country = '{country}' AND T1.category = '{cat}'",
            )


def _extra(v: dict[str, list[Any]]) -> Iterator[Pair]:
    for c in v["customers"]:
        yield (
            f"How much money has {c} spent in total?",
            f"SELECT sum(T3.price * T2.quantity) {_JOIN_ORDERS} WHERE T4.name = '{_q(c)}'",
        )
    for cat in v["categories"]:
        for y in YEARS:
            yield (
                f"What are the names of the customers who bought a product "
                f"in the {cat} category in {y}?",
                f"SELECT DISTINCT T4.name {_JOIN_ORDERS} "
                f"WHERE T3.category = '{cat}' AND T1.order_date LIKE '{y}-%'",
            )
    yield (
        "Which city's customers have spent the most money in total?",
        f"SELECT T4.city {_JOIN_ORDERS} GROUP BY T4.city "
        "ORDER BY sum(T3.price * T2.quantity) DESC LIMIT 1",
    )
    yield (
        "What is the total revenue of each product category?",
        "SELECT T2.category, sum(T1.quantity * T2.price) FROM order_items AS T1 "
        "JOIN products AS T2 ON T1.product_id = T2.product_id GROUP BY T2.category",
    )
    yield (
        "What are the names of the products that cost more than the average price "
        "of their category?",
        "SELECT T1.name FROM products AS T1 WHERE T1.price > "
        "(SELECT avg(T2.price) FROM products AS T2 WHERE T2.category = T1.category)",
    )
    yield (
        "Which supplier's products have been ordered in the largest total quantity?",
        "SELECT T3.name FROM order_items AS T1 JOIN products AS T2 "
        "ON T1.product_id = T2.product_id JOIN suppliers AS T3 "
        "ON T2.supplier_id = T3.supplier_id GROUP BY T3.supplier_id "
        "ORDER BY sum(T1.quantity) DESC LIMIT 1",
    )
    for s in STATUSES:
        yield (
            f"What is the name of the customer with the most orders with the status '{s}'?",
            "SELECT T2.name FROM orders AS T1 JOIN customers AS T2 "
            f"ON T1.customer_id = T2.customer_id WHERE T1.status = '{s}' "
            "GROUP BY T1.customer_id ORDER BY count(*) DESC LIMIT 1",
        )


GENERATORS: dict[str, Callable[[dict[str, list[Any]]], Iterator[Pair]]] = {
    "easy": _easy,
    "medium": _medium,
    "hard": _hard,
    "extra": _extra,
}


def _values(db: sqlite3.Connection) -> dict[str, list[Any]]:
    def col(sql: str) -> list[Any]:
        return [r[0] for r in db.execute(sql)]

    return {
        "cities": col("SELECT DISTINCT city FROM customers ORDER BY city"),
        "countries": col("SELECT DISTINCT country FROM suppliers ORDER BY country"),
        "categories": col("SELECT DISTINCT category FROM products ORDER BY category"),
        "products": col("SELECT name FROM products ORDER BY product_id"),
        "customers": col("SELECT name FROM customers ORDER BY customer_id"),
        "suppliers": col("SELECT name FROM suppliers ORDER BY supplier_id"),
    }


def _unambiguous(db: sqlite3.Connection, sql: str) -> bool:
    """The gold result is not empty, and a ``LIMIT n`` answer is not cut inside a tie."""
    rows = db.execute(sql).fetchall()
    if not rows or all(v is None for r in rows for v in r):
        return False
    head, sep, limit = sql.rpartition(" LIMIT ")
    if not sep:
        return True
    order_key = head.rpartition(" ORDER BY ")[2].removesuffix(" DESC").removesuffix(" ASC")
    keyed = head.replace("SELECT ", f"SELECT {order_key}, ", 1)
    n = int(limit)
    keys = [r[0] for r in db.execute(f"{keyed} LIMIT {n + 1}")]
    return len(keys) <= n or keys[n - 1] != keys[n]


def build_tasks(db_path: Path, seed: int) -> dict[str, list[dict[str, Any]]]:
    """The question/SQL pairs over the database at ``db_path``, split train/val/test."""
    splits: dict[str, list[dict[str, Any]]] = {"train": [], "val": [], "test": []}
    with sqlite3.connect(f"file:{db_path}?mode=ro", uri=True) as db:
        values = _values(db)
        for level in LEVELS:
            rng = random.Random(f"shop-questions-{seed}-{level}")
            pairs = [p for p in GENERATORS[level](values) if _unambiguous(db, p[1])]
            pairs = rng.sample(pairs, min(PER_LEVEL[level], len(pairs)))
            n_train = round(len(pairs) * SPLIT[0])
            n_val = round(len(pairs) * SPLIT[1])
            cuts = {"train": (0, n_train), "val": (n_train, n_train + n_val)}
            cuts["test"] = (n_train + n_val, len(pairs))
            for split, (a, b) in cuts.items():
                for i, (question, sql) in enumerate(pairs[a:b]):
                    splits[split].append(
                        {
                            "id": f"shop-{split}-{level}-{i:03d}",
                            "question": question,
                            "query": sql,
                            "db_id": "shop",
                            "difficulty": level,
                        }
                    )
    db.close()
    for split, tasks in splits.items():
        random.Random(f"shop-order-{seed}-{split}").shuffle(tasks)
    return splits


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def build(out: Path = DATA, seed: int = 0) -> list[Path]:
    """Build the shop database and its train/val/test task files under ``out``."""
    db_path = out / "database" / "shop" / "shop.sqlite"
    build_database(db_path, seed)
    written = [db_path]
    for split, tasks in build_tasks(db_path, seed).items():
        _write_jsonl(out / f"{split}.jsonl", tasks)
        written.append(out / f"{split}.jsonl")
    return written


def undemonstrated_train(demonstrated: int = 100) -> list[dict[str, Any]]:
    """The shipped training questions past the first ``demonstrated``: those the teacher
    does not demonstrate (train.yaml's ``warm_start.limit``). The warm start answers the
    questions it was shown right every time, so their GRPO groups have equal rewards and
    teach nothing; an RL variant the README measures (not the shipped recipe)."""
    path = DATA / "train.jsonl"
    tasks = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return tasks[demonstrated:]


def rl_train() -> list[dict[str, Any]]:
    """``undemonstrated_train`` without the easy questions, which the warm start also
    answers right nearly every time; an RL variant the README measures (not shipped)."""
    return [t for t in undemonstrated_train() if t["difficulty"] != "easy"]


# -- Spider --------------------------------------------------------------------------


def from_spider(spider_dir: Path, out: Path) -> list[Path]:
    """Convert an unpacked Spider release into task files under ``out``.

    ``train_spider.json`` → train, ``dev.json`` → val, ``test.json`` → test (when the
    release has it, with its databases in ``test_database/``).
    """
    sources = {
        "train": ("train_spider.json", "database"),
        "val": ("dev.json", "database"),
        "test": ("test.json", "test_database"),
    }
    written = []
    for split, (name, db_folder) in sources.items():
        src = spider_dir / name
        if not src.is_file():
            if split == "test":
                continue
            raise FileNotFoundError(f"{src} not found: is {spider_dir} an unpacked Spider?")
        tasks = []
        for i, ex in enumerate(json.loads(src.read_text())):
            db_path = (spider_dir / db_folder / ex["db_id"] / f"{ex['db_id']}.sqlite").resolve()
            tasks.append(
                {
                    "id": f"spider-{split}-{i:05d}",
                    "question": ex["question"],
                    "query": ex["query"],
                    "db_id": ex["db_id"],
                    "db_path": str(db_path),
                    "difficulty": None,
                }
            )
        _write_jsonl(out / f"{split}.jsonl", tasks)
        written.append(out / f"{split}.jsonl")
    return written


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=0, help="generator seed (default 0)")
    p.add_argument("--out", type=Path, default=None, help="output folder (default data/)")
    p.add_argument("--spider", type=Path, default=None, help="convert this Spider folder instead")
    args = p.parse_args()
    if args.spider is not None:
        files = from_spider(args.spider, args.out or DATA / "spider")
    else:
        files = build(args.out or DATA, args.seed)
    for f in files:
        print(f)


if __name__ == "__main__":
    main()
