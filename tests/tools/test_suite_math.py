"""math_calculation: hand-checked results, hostile input, and properties of the safe evaluator."""

from __future__ import annotations

import json
import math
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentcredit.tools.suite import SuiteContext, build_suite
from agentcredit.tools.suite.maths import CalcError, evaluate, render


@pytest.fixture(scope="module")
def calc():
    tool = build_suite()["math_calculation"]
    return lambda expression: tool({"expression": expression})


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("add(9, 2030 - 2023)", 16),  # the paper's Fig. 11 call
        ("subtract(10, 4)", 6),
        ("multiply(2, 3, 4)", 24),
        ("divide(7, 2)", 3.5),
        ("divide(10, 2)", 5),
        ("avg(1, 2, 3, 4)", 2.5),
        ("modulus(17, 5)", 2),
        ("isDivisible(10, 5)", True),
        ("isDivisible(10, 3)", False),
        ("power(2, 10)", 1024),
        ("root(27, 3)", 3),
        ("root(2)", 1.41421356237),
        ("root(-8, 3)", -2),
        ("factorial(5)", 120),
        ("gcd(12, 18, 24)", 6),
        ("lcm(4, 6)", 12),
        ("factor(12)", [1, 2, 3, 4, 6, 12]),
        ("primeFactor(360)", [2, 2, 2, 3, 3, 5]),
        ("log(8, 2)", 3),
        ("log(100, 10)", 2),
        ("log(e)", 1),
        ("percentOf(200, 15)", 30),
        ("percentDiscount(80, 25)", 60),
        ("toPercent(0.25)", 25),
        ("fromPercent(25)", 0.25),
        ("decimalToFraction(0.75)", "3/4"),
        ("fractionToDecimal('3/4')", 0.75),
        ("fractionToDecimal(3/4)", 0.75),
        ("multiply(add(1, 2), subtract(10, 4))", 18),
        ("0.1 + 0.2", 0.3),
        ("-(2 ** 3) + 1", -7),
        ("7 // 2", 3),
        ("pi", 3.14159265359),
        ("tau / 2", 3.14159265359),
        ("phi", 1.61803398875),
        ("sqrt(16) + abs(-2) + max(1, 5) - min(3, 4)", 8),
        ("round(2.567, 2)", 2.57),
    ],
)
def test_hand_checked_results(calc, expression: str, expected) -> None:
    assert json.loads(calc(expression)) == {"result": expected}


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("__import__('os').system('echo hi')", "only the listed functions can be called"),
        ("__import__('os')", "unknown function '__import__'"),
        ("().__class__", "unsupported syntax"),
        ("[x for x in range(3)]", "unsupported syntax"),
        ("lambda: 1", "unsupported syntax"),
        ("open('/etc/passwd')", "unknown function 'open'"),
        ("os", "unknown name 'os'"),
        ("2^3", "use power(base, exponent)"),
        ("divide(1, 0)", "division by zero"),
        ("modulus(3, 0)", "modulus by zero"),
        ("log(-1, 10)", "only defined for positive numbers"),
        ("root(-4)", "not a real number"),
        ("factorial(-1)", "non-negative"),
        ("factorial(100000)", "at most 300"),
        ("power(10, 100000)", "more than 400 digits"),
        ("9 ** 9 ** 9", "more than 400 digits"),
        ("1e308 * 10", "not a finite number"),
        ("factor(10 ** 15)", "up to"),
        ("gcd(1.5, 3)", "must be an integer"),
        ("add()", "at least 1 argument"),
        ("subtract(1, 2, 3)", "takes 2 arguments"),
        ("add(1, b=2)", "positional arguments only"),
        ("add('1', 2)", "does not take text arguments"),
        ("'hello'", "text, not a calculation"),
        ("50%", "no currency symbols, units or % signs"),
        ("$5 + 1", "no currency symbols"),
        ("add(1,", "cannot parse"),
        ("", "the expression is empty"),
        ("add" + "(1" * 800 + ")" * 800, "longer than 2000 characters"),
    ],
)
def test_bad_expressions_give_error_text(calc, expression: str, message: str) -> None:
    start = time.perf_counter()
    out = calc(expression)
    assert out.startswith("ERROR: ") and message in out
    assert time.perf_counter() - start < 1.0  # refused fast, never computed


def test_deep_nesting_is_refused() -> None:
    with pytest.raises(CalcError):
        evaluate("-" * 1500 + "1")


def test_random_is_deterministic_and_in_range() -> None:
    first = build_suite(context=SuiteContext(seed=1))["math_calculation"]
    second = build_suite(context=SuiteContext(seed=1))["math_calculation"]
    other = build_suite(context=SuiteContext(seed=2))["math_calculation"]
    outs = [json.loads(first({"expression": "random(1, 1000)"}))["result"] for _ in range(3)]
    assert len(set(outs)) == 1 and 1 <= outs[0] <= 1000
    assert second({"expression": "random(1, 1000)"}) == first({"expression": "random(1, 1000)"})
    pair = json.loads(first({"expression": "add(random(1, 1000), multiply(0, random(1, 1000)))"}))["result"]
    assert 1 <= pair <= 1000
    seeds_differ = {
        json.loads(other({"expression": f"random(1, 10 ** 9) + {i}"}))["result"] - i for i in range(3)
    }
    assert seeds_differ != {outs[0]}


def test_render_rounds_float_noise() -> None:
    assert render(0.1 + 0.2) == 0.3
    assert render(4.0) == 4 and isinstance(render(4.0), int)
    assert render([1.0, True, "3/4"]) == [1, True, "3/4"]


ints = st.integers(min_value=-(10**9), max_value=10**9)


@settings(max_examples=150, deadline=None)
@given(ints, ints)
def test_integer_arithmetic_is_exact(a: int, b: int) -> None:
    assert evaluate(f"add({a}, {b})") == a + b
    assert evaluate(f"subtract({a}, {b})") == a - b
    assert evaluate(f"multiply({a}, {b})") == a * b
    if b != 0:
        assert evaluate(f"modulus({a}, {b})") == a % b
        assert math.isclose(evaluate(f"divide({a}, {b})"), a / b, rel_tol=1e-12)
    if a or b:
        assert evaluate(f"gcd({a}, {b})") == math.gcd(a, b)


@settings(max_examples=100, deadline=None)
@given(st.integers(min_value=1, max_value=10**6))
def test_prime_factors_multiply_back(n: int) -> None:
    factors = evaluate(f"primeFactor({n})")
    assert math.prod(factors) == n and factors == sorted(factors)
    assert evaluate(f"factor({n})")[-1] == n
