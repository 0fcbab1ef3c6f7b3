"""The agent's tool: read-only SQL on the shop database.

A tool is a plain typed function with a Google-style docstring: agentcredit builds the JSON schema the model sees
from the type hints and the ``Args:`` section, checks the model's arguments against it, and gives the model the
returned string (or an ``ERROR: ...`` line) as the tool's result. The config names it ``shop_tools:query``.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from agentcredit.tools.base import ToolUnavailableError

DEFAULT_DB = Path(__file__).resolve().parent / "data" / "shop.db"
MAX_ROWS = 20
MAX_CHARS = 1000


def database_path() -> Path:
    """``$SHOP_DB`` when set, else ``data/shop.db`` beside this file."""
    return Path(os.environ.get("SHOP_DB") or DEFAULT_DB)


def query(sql: str) -> str:
    """Run a read-only SQL query on the shop database. Tables: customers(id, name, city, signup_year),
    products(id, name, category, price), orders(id, customer_id, product_id, quantity, month 'YYYY-MM').

    Args:
        sql: one SQLite SELECT statement
    """
    path = database_path()
    if not path.is_file():  # the setup is missing, not the model's fault: stop instead of training on it
        raise ToolUnavailableError(f"shop database {path} not found; run make_data.py first")
    db = connect_read_only(path)
    try:
        return run_select(db, sql)
    finally:
        db.close()


def connect_read_only(path: Path) -> sqlite3.Connection:
    """A read-only connection: a write is an error for the model, never a change to the database."""
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True)


def run_select(db: sqlite3.Connection, sql: str) -> str:
    """The rows of one SELECT as the model reads them (header, at most MAX_ROWS rows, MAX_CHARS characters)."""
    try:
        cursor = db.execute(sql)
        rows = cursor.fetchmany(MAX_ROWS + 1)
        header = " | ".join(col[0] for col in cursor.description or ())
    except (sqlite3.Error, sqlite3.Warning) as exc:  # Warning: more than one statement
        return f"ERROR: {exc}"
    if not header:
        return "ERROR: the statement returned no rows; use a SELECT"
    lines = [header, *(" | ".join(str(v) for v in row) for row in rows[:MAX_ROWS])]
    if len(rows) > MAX_ROWS:
        lines.append(f"... (more than {MAX_ROWS} rows; add a WHERE or LIMIT)")
    if len(lines) == 1:
        lines.append("(no rows)")
    text = "\n".join(lines)
    return text if len(text) <= MAX_CHARS else text[:MAX_CHARS] + "\n... (cut)"
