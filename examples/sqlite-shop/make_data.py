"""The shop: a small SQLite database and text-to-SQL questions about it, with gold SQL and answers.

Everything is made from one seed, so two runs write the same database and the same questions::

    python make_data.py            # data/shop.db, data/train.jsonl, data/test.jsonl
    python make_data.py --out DIR  # somewhere else

Tables: ``customers`` (40 rows), ``products`` (24), ``orders`` (160). Each question has the SQL that answers it
(``info.demo_calls``: the call the SFT demonstration makes) and the answer, computed by running that SQL. A question
is one (kind, subject) pair, e.g. ("orders of a customer", "Maya"); the pairs are split 75/25 into train and test,
so no test question asks what a training question asked, and each question's wording is one of its kind's phrasings
chosen at random. Numbers are scored numerically, names by exact match (the row's ``metric``).
"""

from __future__ import annotations

import argparse
import json
import random
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

SEED = 0
TEST_SHARE = 0.25
HERE = Path(__file__).resolve().parent

FIRST_NAMES = [
    "Maya", "Omar", "Lena", "Tariq", "Ines", "Jonas", "Priya", "Mateo", "Chloe", "Ravi", "Sofia", "Kenji",
    "Amara", "Lucas", "Nadia", "Felix", "Zara", "Hugo", "Mira", "Elias", "Leila", "Oscar", "Yuki", "Bruno",
    "Anya", "Diego", "Freya", "Idris", "Nora", "Pablo", "Rosa", "Sami", "Tessa", "Viktor", "Wendy", "Xavier",
    "Yara", "Zane", "Alma", "Basil",
]  # fmt: skip
CITIES = ["Lisbon", "Oslo", "Dakar", "Lima", "Hanoi", "Quito"]
CATEGORIES = {
    "books": ["atlas", "cookbook", "novel", "poetry book", "sketchbook"],
    "garden": ["rake", "watering can", "seed kit", "hose", "planter"],
    "kitchen": ["kettle", "teapot", "frying pan", "whisk", "cutting board"],
    "sports": ["yoga mat", "tennis ball", "jump rope", "football", "water bottle"],
    "toys": ["kite", "puzzle", "yo-yo", "robot kit"],
}
MONTHS = ["January", "February", "March", "April", "May", "June"]


def build_database(path: Path, rng: random.Random) -> None:
    """Write the shop database to ``path`` (replacing it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    db = sqlite3.connect(path)
    db.executescript(
        """
        CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT NOT NULL, city TEXT NOT NULL,
                                signup_year INTEGER NOT NULL);
        CREATE TABLE products (id INTEGER PRIMARY KEY, name TEXT NOT NULL, category TEXT NOT NULL,
                               price INTEGER NOT NULL);
        CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER NOT NULL REFERENCES customers(id),
                             product_id INTEGER NOT NULL REFERENCES products(id), quantity INTEGER NOT NULL,
                             month TEXT NOT NULL);
        """
    )
    for i, name in enumerate(FIRST_NAMES, start=1):
        db.execute(
            "INSERT INTO customers VALUES (?, ?, ?, ?)",
            (i, name, rng.choice(CITIES), rng.randint(2018, 2024)),
        )
    product_id = 0
    for category, names in CATEGORIES.items():
        prices = rng.sample(
            range(3, 80), len(names)
        )  # distinct within a category: "most expensive" is unique
        for name, price in zip(names, prices, strict=True):
            product_id += 1
            db.execute("INSERT INTO products VALUES (?, ?, ?, ?)", (product_id, name, category, price))
    for i in range(1, 161):
        db.execute(
            "INSERT INTO orders VALUES (?, ?, ?, ?, ?)",
            (
                i,
                rng.randint(1, len(FIRST_NAMES)),
                rng.randint(1, product_id),
                rng.randint(1, 4),
                f"2024-{rng.randint(1, len(MONTHS)):02d}",
            ),
        )
    db.commit()
    db.close()


@dataclass(frozen=True)
class Kind:
    """One kind of question: its phrasings, its SQL, and the subjects it can ask about."""

    name: str
    tier: str  # "one-table" or "join": reported separately by `agentcredit eval`
    phrasings: tuple[str, ...]
    sql: str
    subjects: Callable[[sqlite3.Connection], list[str]]


def _column(sql: str) -> Callable[[sqlite3.Connection], list[str]]:
    return lambda db: [str(row[0]) for row in db.execute(sql)]


MONTH_OF = {name: f"2024-{i:02d}" for i, name in enumerate(MONTHS, start=1)}

KINDS = (
    Kind(
        "customers_in_city",
        "one-table",
        ("How many customers live in {s}?", "How many of our customers are from {s}?",
         "Count the customers whose city is {s}."),
        "SELECT COUNT(*) FROM customers WHERE city = '{s}'",
        lambda db: CITIES,
    ),
    Kind(
        "city_of_customer",
        "one-table",
        ("Which city does {s} live in?", "What city is the customer {s} from?", "Where does {s} live?"),
        "SELECT city FROM customers WHERE name = '{s}'",
        _column("SELECT name FROM customers"),
    ),
    Kind(
        "price_of_product",
        "one-table",
        ("What is the price of the {s}?", "How much does the {s} cost?", "What does one {s} cost?"),
        "SELECT price FROM products WHERE name = '{s}'",
        _column("SELECT name FROM products"),
    ),
    Kind(
        "products_in_category",
        "one-table",
        ("How many products are in the {s} category?", "How many {s} products does the shop sell?",
         "Count the products in the category {s}."),
        "SELECT COUNT(*) FROM products WHERE category = '{s}'",
        lambda db: list(CATEGORIES),
    ),
    Kind(
        "priciest_in_category",
        "one-table",
        ("Which is the most expensive product in the {s} category?", "What is the priciest {s} product?",
         "Name the {s} product with the highest price."),
        "SELECT name FROM products WHERE category = '{s}' ORDER BY price DESC LIMIT 1",
        lambda db: list(CATEGORIES),
    ),
    Kind(
        "orders_in_month",
        "one-table",
        ("How many orders were placed in {s} 2024?", "How many orders did the shop get in {s} 2024?",
         "Count the orders from {s} 2024."),
        "SELECT COUNT(*) FROM orders WHERE month = '{m}'",
        lambda db: MONTHS,
    ),
    Kind(
        "orders_of_customer",
        "join",
        ("How many orders has {s} placed?", "How many times has {s} ordered from the shop?",
         "Count the orders made by {s}."),
        "SELECT COUNT(*) FROM orders JOIN customers ON customers.id = orders.customer_id "
        "WHERE customers.name = '{s}'",
        _column("SELECT name FROM customers"),
    ),
    Kind(
        "units_of_product",
        "join",
        ("How many units of the {s} have been sold?", "What is the total quantity ordered of the {s}?",
         "How many {s} units did customers buy in total?"),
        "SELECT SUM(orders.quantity) FROM orders JOIN products ON products.id = orders.product_id "
        "WHERE products.name = '{s}'",
        _column("SELECT DISTINCT products.name FROM orders JOIN products ON products.id = orders.product_id"),
    ),
    Kind(
        "spend_of_customer",
        "join",
        ("How much has {s} spent in total?", "What is the total amount {s} has paid for orders?",
         "How much money has {s} spent at the shop?"),
        "SELECT SUM(orders.quantity * products.price) FROM orders "
        "JOIN products ON products.id = orders.product_id JOIN customers ON customers.id = orders.customer_id "
        "WHERE customers.name = '{s}'",
        _column("SELECT DISTINCT customers.name FROM orders JOIN customers ON customers.id = orders.customer_id"),
    ),
)  # fmt: skip


def make_questions(db_path: Path, rng: random.Random) -> dict[str, list[dict]]:
    """Train and test questions: every (kind, subject) pair once, split by ``TEST_SHARE``, answers from the DB."""
    db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    pairs = [(kind, subject) for kind in KINDS for subject in kind.subjects(db)]
    rng.shuffle(pairs)
    n_test = round(len(pairs) * TEST_SHARE)
    splits: dict[str, list[dict]] = {"test": [], "train": []}
    for i, (kind, subject) in enumerate(pairs):
        split = "test" if i < n_test else "train"
        sql = kind.sql.format(s=subject, m=MONTH_OF.get(subject, ""))
        rows = db.execute(sql).fetchall()
        assert len(rows) == 1 and rows[0][0] is not None, (sql, rows)
        answer = rows[0][0]
        splits[split].append(
            {
                "id": f"{split}-{len(splits[split]):03d}",
                "question": rng.choice(kind.phrasings).format(s=subject),
                "answers": [str(answer)],
                "metric": "numeric" if isinstance(answer, int | float) else "em",
                "kind": kind.name,
                "tier": kind.tier,
                "demo_calls": [[{"name": "query", "arguments": {"sql": sql}}]],
            }
        )
    db.close()
    return splits


def make_data(out: Path = HERE / "data", seed: int = SEED) -> dict[str, Path]:
    """Write ``shop.db``, ``train.jsonl`` and ``test.jsonl`` under ``out``; returns their paths."""
    rng = random.Random(seed)
    paths = {"db": out / "shop.db", "train": out / "train.jsonl", "test": out / "test.jsonl"}
    build_database(paths["db"], rng)
    for split, rows in make_questions(paths["db"], rng).items():
        paths[split].write_text("".join(json.dumps(row) + "\n" for row in rows))
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=HERE / "data", help="Output folder (default: ./data).")
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args()
    paths = make_data(args.out, args.seed)
    counts = {split: sum(1 for _ in paths[split].open()) for split in ("train", "test")}
    print(f"wrote {paths['db']} and {counts['train']} train / {counts['test']} test questions in {args.out}")


if __name__ == "__main__":
    main()
