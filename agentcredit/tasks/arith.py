"""``arith-tools``: arithmetic questions in two tiers, so a model can learn *when* a python call pays off.

carl-segment's motivating case is "347 x 28 warrants a calculator while 2 + 2 does not" (paper section 1).
Easy questions are answerable mentally (sums and differences up to 30, one-digit products); hard ones are
not, for a small model (three-digit x two-digit products, two-step expressions, exact long division).
Every example carries ``info["tier"]`` ("easy" / "hard") and its exact integer answer.

Generation is deterministic from ``(split, seed)`` in every process (seeds come from blake2b, not ``hash()``).
Train and test never share an expression: the expression space is partitioned by a stable hash of the
canonical expression, 20% of it reserved for ``test``, so any seed of ``train`` and any seed of ``test``
are disjoint. Within one call no expression repeats.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from agentcredit.tasks.example import Example, stable_int, stable_rng

TASK = "arith-tools"
TIERS = ("easy", "hard")
SPLITS = ("train", "test")
TEST_SHARE_PER_MILLE = 200  # 20% of the expression space belongs to the test split

# A problem: (kind, operands, canonical python expression, exact value).
Problem = tuple[str, tuple[int, ...], str, int]


def _easy(rng: random.Random) -> Problem:
    kind = rng.choice(("add", "sub", "mul"))
    if kind == "add":
        a, b = rng.randint(1, 30), rng.randint(1, 30)
        return kind, (a, b), f"{a}+{b}", a + b
    if kind == "sub":
        a = rng.randint(2, 30)
        b = rng.randint(1, a - 1)
        return kind, (a, b), f"{a}-{b}", a - b
    a, b = rng.randint(2, 10), rng.randint(2, 10)
    return kind, (a, b), f"{a}*{b}", a * b


def _hard(rng: random.Random) -> Problem:
    kind = rng.choice(("mul", "mul_add", "sum_mul", "mul_sub", "div"))
    if kind == "mul":  # 347 x 28
        a, b = rng.randint(100, 999), rng.randint(11, 99)
        return kind, (a, b), f"{a}*{b}", a * b
    if kind == "mul_add":
        a, b, c = rng.randint(11, 99), rng.randint(11, 99), rng.randint(100, 999)
        return kind, (a, b, c), f"{a}*{b}+{c}", a * b + c
    if kind == "sum_mul":
        a, b, c = rng.randint(100, 999), rng.randint(100, 999), rng.randint(11, 99)
        return kind, (a, b, c), f"({a}+{b})*{c}", (a + b) * c
    if kind == "mul_sub":
        a, b, c, d = (rng.randint(11, 99) for _ in range(4))
        if a * b < c * d:  # keep the answer positive so the word-problem phrasing makes sense
            a, b, c, d = c, d, a, b
        return kind, (a, b, c, d), f"{a}*{b}-{c}*{d}", a * b - c * d
    quotient, divisor = rng.randint(100, 999), rng.randint(11, 99)  # exact division: 9716 / 28 = 347
    return "div", (quotient * divisor, divisor), f"{quotient * divisor}//{divisor}", quotient


_DRAW: dict[str, Callable[[random.Random], Problem]] = {"easy": _easy, "hard": _hard}

# ----------------------------------------------------------------------------------------------------
# Phrasing

_NAMES = ("Ava", "Ben", "Chen", "Dara", "Eli", "Farah", "Gus", "Hana", "Ivo", "Jin", "Kofi", "Lena")
_ITEMS = ("apples", "marbles", "stickers", "pencils", "books", "coins", "stamps", "shells")
_MUL = ("×", "*", "times")
_DIV = ("÷", "/", "divided by")
_PLAIN = (
    "What is {e}?",
    "Compute {e}.",
    "Calculate {e}.",
    "How much is {e}?",
    "Evaluate {e}.",
    "What does {e} equal?",
)
_WORD = {
    "add": "{name} has {0} {item} and gets {1} more. How many {item} does {name} have now?",
    "sub": "{name} had {0} {item} and gave away {1}. How many {item} does {name} have left?",
    "mul": "There are {0} boxes with {1} {item} in each box. How many {item} are there in total?",
    "mul_add": "A shop has {0} packs of {1} {item} and {2} loose {item}. How many {item} does it have?",
    "sum_mul": "Two schools have {0} and {1} pupils. Every pupil needs {2} {item}. "
    "How many {item} are needed in total?",
    "mul_sub": "A farmer plants {0} rows of {1} trees and later removes {2} rows of {3} trees. "
    "How many trees are left?",
    "div": "{0} {item} are shared equally among {1} children. How many {item} does each child get?",
}
WORD_PROBLEM_SHARE = 0.3


def _render_expression(kind: str, ops: tuple[int, ...], rng: random.Random) -> str:
    mul, div = rng.choice(_MUL), rng.choice(_DIV)
    forms = {
        "add": "{0} + {1}",
        "sub": "{0} - {1}",
        "mul": "{0} " + mul + " {1}",
        "mul_add": "{0} " + mul + " {1} + {2}",
        "sum_mul": "({0} + {1}) " + mul + " {2}",
        "mul_sub": "{0} " + mul + " {1} - {2} " + mul + " {3}",
        "div": "{0} " + div + " {1}",
    }
    return forms[kind].format(*ops)


def render_question(kind: str, ops: tuple[int, ...], rng: random.Random) -> tuple[str, str]:
    """``(question, template_id)`` for a problem; ``rng`` chooses the phrasing only."""
    if rng.random() < WORD_PROBLEM_SHARE:
        return _WORD[kind].format(*ops, name=rng.choice(_NAMES), item=rng.choice(_ITEMS)), f"word-{kind}"
    template = rng.randrange(len(_PLAIN))
    return _PLAIN[template].format(e=_render_expression(kind, ops, rng)), f"plain-{template}"


# ----------------------------------------------------------------------------------------------------
# Generation


def split_of(expression: str) -> str:
    """The split an expression belongs to (stable across processes and seeds)."""
    return "test" if stable_int(TASK, "split", expression) % 1000 < TEST_SHARE_PER_MILLE else "train"


def _draw_distinct(tier: str, count: int, split: str, seed: int) -> list[Problem]:
    rng = stable_rng(TASK, split, seed, tier)
    seen: set[str] = set()
    problems: list[Problem] = []
    attempts, max_attempts = 0, 50 * count + 20_000
    while len(problems) < count:
        attempts += 1
        if attempts > max_attempts:
            raise ValueError(
                f"{TASK}: could only find {len(problems)} distinct {tier} {split} questions, asked for {count}; "
                "ask for fewer or lower easy_fraction"
            )
        problem = _DRAW[tier](rng)
        expression = problem[2]
        if expression in seen or split_of(expression) != split:
            continue
        seen.add(expression)
        problems.append(problem)
    return problems


def generate(n: int, seed: int = 0, *, split: str = "train", easy_fraction: float = 0.5) -> list[Example]:
    """``n`` arithmetic questions, ``round(n * easy_fraction)`` of them easy, shuffled; same inputs, same output.

    The easy pools hold 1,416 distinct expressions, 1,135 of them in ``train`` and 281 in ``test``; the hard
    pools are effectively unbounded. Asking for more easy questions than exist raises ValueError.
    """
    if split not in SPLITS:
        raise ValueError(f"{TASK}: split must be one of {SPLITS}, got {split!r}")
    if n < 0:
        raise ValueError(f"{TASK}: n must be >= 0, got {n}")
    if not 0.0 <= easy_fraction <= 1.0:
        raise ValueError(f"{TASK}: easy_fraction must be in [0, 1], got {easy_fraction}")
    n_easy = round(n * easy_fraction)
    tiers = ["easy"] * n_easy + ["hard"] * (n - n_easy)
    problems = _draw_distinct("easy", n_easy, split, seed) + _draw_distinct("hard", n - n_easy, split, seed)
    order = list(range(n))
    stable_rng(TASK, split, seed, "order").shuffle(order)
    phrasing = stable_rng(TASK, split, seed, "phrasing")
    examples = []
    for position, index in enumerate(order):
        kind, ops, expression, value = problems[index]
        question, template = render_question(kind, ops, phrasing)
        examples.append(
            Example(
                id=f"{TASK}-{split}-s{seed}-{position:05d}",
                question=question,
                answers=[str(value)],
                task=TASK,
                info={
                    "metric": "numeric",
                    "tier": tiers[index],
                    "kind": kind,
                    "expression": expression,
                    "operands": list(ops),
                    "template": template,
                    "split": split,
                    "seed": seed,
                },
            )
        )
    return examples
