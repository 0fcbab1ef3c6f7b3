"""Per-episode environments for the tests (``tools.environment: "calculator_env:CalculatorEnv"``).

Each has the suite's ``math_calculation`` name, so the tiny model fitted on chat demonstrations calls it. The
counters are class-wide so a test can check that every environment opened was closed.
"""

from __future__ import annotations

import itertools
import re
import threading

from agentcredit.tools.episodes import ToolEnv


class CalculatorEnv(ToolEnv):
    """A calculator with a step reward: ``step_reward`` for a step that computes the example's own expression."""

    tools = ("math_calculation",)
    lock = threading.Lock()
    opened = 0
    closed = 0
    resets: list[str] = []

    def __init__(self, step_reward: float = 0.25):
        self.step_reward = step_reward
        with CalculatorEnv.lock:
            CalculatorEnv.opened += 1

    def reset(self, example) -> None:
        self.expression = example.info["expression"]
        with CalculatorEnv.lock:
            CalculatorEnv.resets.append(example.id)

    def math_calculation(self, expression: str) -> str:
        """Evaluate an arithmetic expression.

        Args:
            expression: digits, + - * / ( ) and spaces
        """
        if not re.fullmatch(r"[\d+\-*/() ]+", expression):
            raise ValueError(f"not an arithmetic expression: {expression!r}")
        return str(eval(expression))  # noqa: S307 - the regex above admits arithmetic only

    def step(self, calls):
        observations, _, _ = super().step(calls)
        hit = any(c.arguments.get("expression") == self.expression for c in calls)
        return observations, False, self.step_reward if hit else 0.0

    def close(self) -> None:
        with CalculatorEnv.lock:
            CalculatorEnv.closed += 1

    @classmethod
    def reset_counters(cls) -> None:
        cls.opened, cls.closed, cls.resets = 0, 0, []


_ticks = itertools.count()


class DriftingEnv(CalculatorEnv):
    """Answers the same call differently each time: a tree strategy cannot branch it by replay."""

    def math_calculation(self, expression: str) -> str:
        """Evaluate an arithmetic expression.

        Args:
            expression: digits, + - * / ( ) and spaces
        """
        return f"{super().math_calculation(expression)} (call {next(_ticks)})"


class BrokenStepEnv(CalculatorEnv):
    """Its own ``step`` raises: the user's code is broken, and the command must stop saying where."""

    def step(self, calls):
        raise KeyError("no such table: orders")


class FinishingEnv(CalculatorEnv):
    """Ends the episode at the first step that computes the example's expression, with reward 1."""

    def step(self, calls):
        observations, _, reward = super().step(calls)
        return observations, reward > 0, 1.0 if reward > 0 else 0.0
