"""The agent's environment: the shop database, one read-only connection per episode.

``shop_tools.query`` (a plain function) opens the database on every call. An environment holds state for one
episode instead: agentcredit makes a ``ShopEnv`` per episode, calls ``reset(example)`` before its first tool call,
``step(calls)`` at every tool turn and ``close()`` when the episode ends. The model sees the same ``query`` tool
(its schema comes from the method's type hints and docstring), so the two are interchangeable in shop.yaml.

``step`` also returns a reward for the step. Here: ``error_reward`` (shop.yaml's ``tools.environment_options``;
0 by default) for a tool turn whose every query failed. The episode's reward is then its outcome plus these step
rewards, and PPO, carl-segment and PORTool put each on the step that earned it (agentcredit.tools.episodes).
"""

from __future__ import annotations

from shop_tools import connect_read_only, database_path, run_select

from agentcredit.tools.base import ToolUnavailableError
from agentcredit.tools.episodes import ToolEnv


class ShopEnv(ToolEnv):
    tools = ("query",)

    def __init__(self, error_reward: float = 0.0):
        self.error_reward = error_reward
        self.db = None

    def reset(self, example) -> None:
        path = database_path()
        if not path.is_file():  # the setup is missing, not the model's fault: stop instead of training on it
            raise ToolUnavailableError(f"shop database {path} not found; run make_data.py first")
        self.db = connect_read_only(path)

    def query(self, sql: str) -> str:
        """Run a read-only SQL query on the shop database. Tables: customers(id, name, city, signup_year),
        products(id, name, category, price), orders(id, customer_id, product_id, quantity, month 'YYYY-MM').

        Args:
            sql: one SQLite SELECT statement
        """
        return run_select(self.db, sql)

    def step(self, calls):
        results, done, _ = super().step(calls)
        failed = all(not r.ok for r in results)
        return results, done, self.error_reward if failed else 0.0

    def close(self) -> None:
        if self.db is not None:
            self.db.close()
