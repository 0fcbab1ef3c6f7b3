"""``arith-tools``: arithmetic questions in tiers, so a model can learn *when* a python call pays off.

carl-segment's motivating case is "347 x 28 warrants a calculator while 2 + 2 does not" (paper section 1).
Easy questions are answerable mentally (sums and differences up to 30, one-digit products); hard ones are
not, for a small model (three-digit x two-digit products, two-step expressions, exact long division). The
optional medium tier (``medium_fraction``) sits at a small model's competence boundary: two-digit sums and
differences and two-digit x one-digit products, answerable without the tool only part of the time, which is
where *when to call* is an open question for RL rather than settled by the demonstrations.
Every example carries ``info["tier"]`` ("easy" / "medium" / "hard") and its exact integer answer.

Phrasing: ``phrasing="seen"`` (the default, and the only one training may use) draws from the templates below;
``phrasing="new"`` draws from a disjoint set of templates (other wordings, "plus"/"minus", other word problems)
and is allowed only for the test split, so a held-out evaluation can tell reading a question from recalling a
training template.

The tool can hurt (``tool_failure_rate`` > 0, a task option): the python tool's answer to a program is then
replaced, with that probability, by an empty, garbled or off-by-one output (:func:`tool_failure`). The failure is
part of the environment (carl-segment Table 16: useless tool output costs 2.5-7.5 EM; "unnecessary tools add
risk"), not an infrastructure error: the model reads it like any answer. It is seeded by ``tool_failure_seed``
and the program's text, so it is the same in every process, thread order and run.

Generation is deterministic from ``(split, seed)`` in every process (seeds come from blake2b, not ``hash()``).
Train and test never share an expression: the expression space is partitioned by a stable hash of the
canonical expression, 20% of it reserved for ``test``, so any seed of ``train`` and any seed of ``test``
are disjoint. Within one call no expression repeats.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from agentcredit.tasks.example import Example, stable_int, stable_rng

TASK = "arith-tools"
TIERS = ("easy", "medium", "hard")
PHRASINGS = ("seen", "new")
SPLITS = ("train", "test")
TEST_SHARE_PER_MILLE = 200  # 20% of the expression space belongs to the test split

# A problem: (kind, operands, canonical python expression, exact value).
Problem = tuple[str, tuple[int, ...], str, int]


#: The easy tier's largest operand by default (sums and differences up to 30, products up to 10 x 10); the
#: medium tier starts above it (31-99), so ``easy_max_operand`` may only lower it.
EASY_MAX_OPERAND = 30

#: How the tool that can hurt fails (:func:`tool_failure`): off_by_one is plausible but wrong, the other two are
#: easy to spot.
TOOL_FAILURE_MODES = ("empty", "garbled", "off_by_one")


def _easy(rng: random.Random, max_operand: int = EASY_MAX_OPERAND) -> Problem:
    # ``max_operand`` below 30 narrows the tier to what a small start knows alone (the embedded 135M
    # model answers sums and differences of one-digit operands far better than two-digit ones); at 30 the draws
    # are the ones every earlier run made, so their questions and fingerprints do not change.
    kind = rng.choice(("add", "sub", "mul"))
    if kind == "add":
        a, b = rng.randint(1, max_operand), rng.randint(1, max_operand)
        return kind, (a, b), f"{a}+{b}", a + b
    if kind == "sub":
        a = rng.randint(2, max_operand)
        b = rng.randint(1, a - 1)
        return kind, (a, b), f"{a}-{b}", a - b
    a, b = rng.randint(2, min(10, max_operand)), rng.randint(2, min(10, max_operand))
    return kind, (a, b), f"{a}*{b}", a * b


#: How the easy tier is drawn: ``small`` (sums and differences of small operands, one-digit products; the
#: original draw) or ``identity`` (n + 0, n - 0, n x 1, 1 x n over n in 100-99,999).
EASY_KINDS = ("small", "identity")
IDENTITY_RANGE = (100, 99_999)


def _identity(rng: random.Random) -> Problem:
    # Issue 49: carl-segment's mechanism needs an easy tier the start answers alone (the paper's Tier 1 is defined
    # by the model's own success), and the 135M start answers small sums only ~0.73 of the time at T = 1. Copying a
    # number is within its reach, and tens of thousands of distinct n keep the tier from being memorised.
    n = rng.randint(*IDENTITY_RANGE)
    kind = rng.choice(("add", "sub", "mul", "mul_left"))
    if kind == "add":
        return kind, (n, 0), f"{n}+0", n
    if kind == "sub":
        return kind, (n, 0), f"{n}-0", n
    if kind == "mul":
        return kind, (n, 1), f"{n}*1", n
    return "mul", (1, n), f"1*{n}", n


def _medium(rng: random.Random) -> Problem:
    kind = rng.choice(("add", "sub", "mul"))
    if kind == "add":  # 47 + 68
        a, b = rng.randint(31, 99), rng.randint(31, 99)
        return kind, (a, b), f"{a}+{b}", a + b
    if kind == "sub":  # 83 - 37
        a = rng.randint(50, 99)
        b = rng.randint(11, a - 11)
        return kind, (a, b), f"{a}-{b}", a - b
    a, b = rng.randint(11, 25), rng.randint(3, 9)  # 17 x 6
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


_DRAW: dict[str, Callable[[random.Random], Problem]] = {"easy": _easy, "medium": _medium, "hard": _hard}

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

# Held-out phrasings (``phrasing="new"``): no training or SFT question uses these wordings.
_NEW_PLAIN = (
    "Find the value of {e}.",
    "Work out {e}.",
    "What number do you get from {e}?",
    "Tell me the result of {e}.",
)
_NEW_WORD = {
    "add": "{name} read {0} pages on Monday and {1} pages on Tuesday. How many pages did {name} read in all?",
    "sub": "A tank held {0} litres of water and {1} litres leaked out. How many litres are still in the tank?",
    "mul": "A bus makes {0} trips a day and carries {1} people on each trip. How many people ride it each day?",
    "mul_add": "A library has {0} shelves with {1} novels each, plus {2} novels on a cart. How many novels is that?",
    "sum_mul": "A club sells {0} tickets on Friday and {1} on Saturday, each for {2} dollars. How many dollars "
    "does it collect?",
    "mul_sub": "A warehouse gets {0} crates of {1} bottles and ships out {2} crates of {3} bottles. How many "
    "bottles remain?",
    "div": "A ribbon {0} centimetres long is cut into {1} equal pieces. How long is each piece in centimetres?",
}


def _render_expression(kind: str, ops: tuple[int, ...], rng: random.Random, phrasing: str = "seen") -> str:
    mul, div = rng.choice(_MUL), rng.choice(_DIV)
    plus, minus = ("plus", "minus") if phrasing == "new" else ("+", "-")
    forms = {
        "add": "{0} " + plus + " {1}",
        "sub": "{0} " + minus + " {1}",
        "mul": "{0} " + mul + " {1}",
        "mul_add": "{0} " + mul + " {1} + {2}",
        "sum_mul": "({0} + {1}) " + mul + " {2}",
        "mul_sub": "{0} " + mul + " {1} - {2} " + mul + " {3}",
        "div": "{0} " + div + " {1}",
    }
    return forms[kind].format(*ops)


def render_question(
    kind: str, ops: tuple[int, ...], rng: random.Random, phrasing: str = "seen"
) -> tuple[str, str]:
    """``(question, template_id)`` for a problem; ``rng`` chooses the phrasing only."""
    plain, word, prefix = (_PLAIN, _WORD, "") if phrasing == "seen" else (_NEW_PLAIN, _NEW_WORD, "new-")
    if rng.random() < WORD_PROBLEM_SHARE:
        question = word[kind].format(*ops, name=rng.choice(_NAMES), item=rng.choice(_ITEMS))
        return question, f"{prefix}word-{kind}"
    template = rng.randrange(len(plain))
    return plain[template].format(e=_render_expression(kind, ops, rng, phrasing)), f"{prefix}plain-{template}"


# ----------------------------------------------------------------------------------------------------
# Generation


def split_of(expression: str) -> str:
    """The split an expression belongs to (stable across processes and seeds)."""
    return "test" if stable_int(TASK, "split", expression) % 1000 < TEST_SHARE_PER_MILLE else "train"


def _draw_distinct(
    tier: str,
    count: int,
    split: str,
    seed: int,
    easy_max_operand: int = EASY_MAX_OPERAND,
    easy_kind: str = "small",
) -> list[Problem]:
    rng = stable_rng(TASK, split, seed, tier)
    if tier == "easy":
        draw = _identity if easy_kind == "identity" else (lambda r: _easy(r, easy_max_operand))
    else:
        draw = _DRAW[tier]
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
        problem = draw(rng)
        expression = problem[2]
        if expression in seen or split_of(expression) != split:
            continue
        seen.add(expression)
        problems.append(problem)
    return problems


def generate(
    n: int,
    seed: int = 0,
    *,
    split: str = "train",
    easy_fraction: float = 0.5,
    medium_fraction: float = 0.0,
    phrasing: str = "seen",
    tool_failure_rate: float = 0.0,
    tool_failure_seed: int = 0,
    easy_max_operand: int = EASY_MAX_OPERAND,
    easy_kind: str = "small",
    tool_failure_modes: tuple[str, ...] | list[str] = TOOL_FAILURE_MODES,
) -> list[Example]:
    """``n`` arithmetic questions, shuffled; same inputs, same output.

    ``round(n * easy_fraction)`` are easy, ``round(n * medium_fraction)`` medium, the rest hard. The easy pools
    hold 1,416 distinct expressions, 1,135 of them in ``train`` and 281 in ``test``; the medium and hard pools
    are far larger. ``easy_max_operand`` (2-30) lowers the easy tier's largest operand: at 10 the easy pools
    hold 226 expressions (sums and differences of operands up to 10, products up to 10 x 10), 181 in ``train``
    and 45 in ``test``. ``easy_kind="identity"`` draws the easy tier as n + 0, n - 0, n x 1 and 1 x n over n in
    100-99,999 instead (a tier a small start answers alone; ``easy_max_operand`` does not apply).
    ``tool_failure_modes`` (read by the environment's python tool) narrows how the tool fails, e.g. to
    ``[off_by_one]``, plausible but wrong. Asking for more questions of a tier than exist raises ValueError. ``phrasing="new"`` (test
    split only) uses the held-out templates; its ids carry ``-new`` so they never collide with the seen ones.
    """
    if split not in SPLITS:
        raise ValueError(f"{TASK}: split must be one of {SPLITS}, got {split!r}")
    if n < 0:
        raise ValueError(f"{TASK}: n must be >= 0, got {n}")
    for name, share in (("easy_fraction", easy_fraction), ("medium_fraction", medium_fraction)):
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"{TASK}: {name} must be in [0, 1], got {share}")
    if easy_fraction + medium_fraction > 1.0 + 1e-9:
        raise ValueError(
            f"{TASK}: easy_fraction + medium_fraction must be <= 1, got {easy_fraction} + {medium_fraction}"
        )
    check_tool_failure(tool_failure_rate, tool_failure_seed, tool_failure_modes)  # read by the python tool
    if easy_kind not in EASY_KINDS:
        raise ValueError(f"{TASK}: easy_kind must be one of {EASY_KINDS}, got {easy_kind!r}")
    if (
        not isinstance(easy_max_operand, int)
        or isinstance(easy_max_operand, bool)
        or not 2 <= easy_max_operand <= EASY_MAX_OPERAND
    ):
        raise ValueError(
            f"{TASK}: easy_max_operand must be an integer in [2, {EASY_MAX_OPERAND}], got {easy_max_operand!r}"
        )
    if phrasing not in PHRASINGS:
        raise ValueError(f"{TASK}: phrasing must be one of {PHRASINGS}, got {phrasing!r}")
    if phrasing == "new" and split != "test":
        raise ValueError(
            f"{TASK}: phrasing='new' is held out for evaluation: use split='test', got {split!r}"
        )
    n_easy, n_medium = round(n * easy_fraction), round(n * medium_fraction)
    n_hard = max(0, n - n_easy - n_medium)
    n_medium = n - n_easy - n_hard
    tiers = ["easy"] * n_easy + ["medium"] * n_medium + ["hard"] * n_hard
    problems = _draw_distinct("easy", n_easy, split, seed, easy_max_operand, easy_kind) + _draw_distinct(
        "hard", n_hard, split, seed
    )
    if n_medium:  # drawn from their own stream, so the easy and hard questions of a seed do not change
        problems[n_easy:n_easy] = _draw_distinct("medium", n_medium, split, seed)
    order = list(range(n))
    stable_rng(TASK, split, seed, "order").shuffle(order)
    suffix = "" if phrasing == "seen" else "-new"
    phrasing_rng = stable_rng(TASK, split, seed, "phrasing" + suffix)
    examples = []
    for position, index in enumerate(order):
        kind, ops, expression, value = problems[index]
        question, template = render_question(kind, ops, phrasing_rng, phrasing)
        examples.append(
            Example(
                id=f"{TASK}-{split}{suffix}-s{seed}-{position:05d}",
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
                    "phrasing": phrasing,
                    "split": split,
                    "seed": seed,
                },
            )
        )
    return examples


# ----------------------------------------------------------------------------------------------------
# The tool that can hurt


def check_tool_failure(
    rate: float, seed: int, modes: tuple[str, ...] | list[str] = TOOL_FAILURE_MODES
) -> None:
    if not isinstance(rate, int | float) or not 0.0 <= rate <= 1.0:
        raise ValueError(f"{TASK}: tool_failure_rate must be in [0, 1], got {rate!r}")
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ValueError(f"{TASK}: tool_failure_seed must be an integer, got {seed!r}")
    if (
        isinstance(modes, str)
        or not modes
        or any(m not in TOOL_FAILURE_MODES for m in modes)
        or len(set(modes)) != len(modes)
    ):
        raise ValueError(
            f"{TASK}: tool_failure_modes must be a non-empty list of distinct modes of {TOOL_FAILURE_MODES}, "
            f"got {modes!r}"
        )


def tool_failure(
    code: str, rate: float, seed: int, modes: tuple[str, ...] | list[str] = TOOL_FAILURE_MODES
) -> str | None:
    """How the python tool fails on ``code`` (one of ``modes``), or None when it works.

    A program fails with probability ``rate``: u = blake2b(seed, code) / 2^64 is uniform on [0, 1) and the tool
    fails when u < rate; the mode is drawn from a second hash. The same program under the same seed always gets
    the same answer, like a flaky service keyed by its request, whatever the process or thread order. With all
    three modes (the default) the draws are the ones every earlier run made.
    """
    if rate <= 0.0:
        return None
    if stable_int(TASK, "tool-failure", seed, code) / 2**64 >= rate:
        return None
    modes = tuple(modes)
    return modes[stable_int(TASK, "tool-failure-mode", seed, code) % len(modes)]


_GARBLE = str.maketrans("0123456789", "3074185296")  # d -> (7d + 3) mod 10: a bijection with no fixed digit


def corrupt_output(output: str, mode: str, code: str, seed: int) -> str:
    """The failed tool's text: ``empty`` -> "", ``garbled`` -> every digit d replaced by (7d + 3) mod 10,
    ``off_by_one`` -> every integer moved by the same +1 or -1 (sign seeded by the program)."""
    import re

    if mode == "empty":
        return ""
    if mode == "garbled":
        return output.translate(_GARBLE)
    if mode == "off_by_one":
        step = 1 if stable_int(TASK, "tool-failure-sign", seed, code) % 2 else -1
        return re.sub(r"-?\d+", lambda m: str(int(m.group()) + step), output)
    raise ValueError(f"{TASK}: unknown tool failure mode {mode!r}")


def failing_tool(
    fn: Callable[[dict], str], rate: float, seed: int, modes: tuple[str, ...] | list[str] = TOOL_FAILURE_MODES
) -> Callable[[dict], str]:
    """``fn`` (the python tool) with seeded failures (:func:`tool_failure`); an infrastructure failure or an
    ERROR text of the tool itself passes through unchanged (a failure of the machine is never disguised)."""
    check_tool_failure(rate, seed, modes)

    def python(arguments: dict) -> str:
        output = fn(arguments)
        code = arguments.get("code") if isinstance(arguments, dict) else None
        if not isinstance(code, str) or type(output) is not str or output.startswith("ERROR:"):
            return output
        mode = tool_failure(code, rate, seed, modes)
        return output if mode is None else corrupt_output(output, mode, code, seed)

    return python


def tool_wrapper(
    options: Mapping[str, Any],
) -> Callable[[Callable[[dict], str]], Callable[[dict], str]] | None:
    """The task's python tool as its ``options`` make it: :func:`failing_tool` with the seeded failures of
    ``tool_failure_rate`` / ``tool_failure_seed`` / ``tool_failure_modes`` (the tool that can hurt is part of the
    environment), or None (the tool as it is) without them."""
    if options.get("tool_failure_rate", 0.0) > 0:
        return partial(
            failing_tool,
            rate=options["tool_failure_rate"],
            seed=options.get("tool_failure_seed", 0),
            modes=options.get("tool_failure_modes", TOOL_FAILURE_MODES),
        )
    return None
