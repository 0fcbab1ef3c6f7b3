"""``math_calculation``: evaluates the paper's function-call expressions safely.

Model text is never passed to ``eval``. It is parsed with :mod:`ast` and only a whitelist is interpreted:
numbers, ``+ - * / // **``, unary signs, parentheses, the constants pi, e, phi, tau and the functions of
portool.md §2.5.2 (plus sqrt, abs, round, floor, ceil, min, max). Sizes are bounded so a call cannot hang the
pool (huge powers, factorials, factorisations of huge numbers).
"""

from __future__ import annotations

import ast
import hashlib
import math
import random
from collections.abc import Callable
from fractions import Fraction
from typing import Any

MAX_EXPRESSION_CHARS = 2000
MAX_NODES = 400
MAX_INT_DIGITS = 400  # larger integer results are refused instead of printing pages of digits
MAX_FACTORIAL = 300
MAX_FACTOR_INPUT = 10**12  # trial division up to 10**6 steps

Number = int | float


class CalcError(ValueError):
    """A problem with the expression; the message becomes ``ERROR: <message>``."""


def _num(x: Any, what: str) -> Number:
    if isinstance(x, bool) or not isinstance(x, int | float):
        raise CalcError(f"{what} must be a number, got {_describe(x)}")
    if isinstance(x, float) and not math.isfinite(x):
        raise CalcError(f"{what} is not a finite number")
    return x


def _int(x: Any, what: str) -> int:
    x = _num(x, what)
    if isinstance(x, float):
        if not x.is_integer():
            raise CalcError(f"{what} must be an integer, got {x}")
        x = int(x)
    return x


def _describe(x: Any) -> str:
    if isinstance(x, bool):
        return "a boolean"
    if isinstance(x, list):
        return "a list"
    if isinstance(x, str):
        return f"the text {x!r}"
    return repr(x)


def _check_size(x: Any) -> Any:
    if isinstance(x, int) and not isinstance(x, bool) and len(str(abs(x))) > MAX_INT_DIGITS:
        raise CalcError(f"the result has more than {MAX_INT_DIGITS} digits")
    if isinstance(x, float) and not math.isfinite(x):
        raise CalcError("the result is not a finite number (overflow or undefined)")
    return x


def _divide(a: Any, b: Any) -> Number:
    a, b = _num(a, "dividend"), _num(b, "divisor")
    if b == 0:
        raise CalcError("division by zero")
    if isinstance(a, int) and isinstance(b, int) and a % b == 0:
        return a // b
    return a / b


def _power(base: Any, exponent: Any) -> Number:
    base, exponent = _num(base, "base"), _num(exponent, "exponent")
    if isinstance(base, int) and isinstance(exponent, int) and exponent >= 0:
        if abs(base) > 1 and exponent * math.log10(abs(base)) > MAX_INT_DIGITS:
            raise CalcError(f"the result has more than {MAX_INT_DIGITS} digits")
        return base**exponent
    if base == 0 and exponent < 0:
        raise CalcError("division by zero (0 raised to a negative power)")
    try:
        result = float(base) ** float(exponent)
    except OverflowError:
        raise CalcError("the result is too large") from None
    if isinstance(result, complex):
        raise CalcError("the result is not a real number (negative base with a fractional exponent)")
    return result


def _root(number: Any, degree: Any = 2) -> Number:
    number, degree = _num(number, "number"), _num(degree, "degree")
    if degree == 0:
        raise CalcError("the root degree must not be 0")
    if number < 0:
        if isinstance(degree, float) and not degree.is_integer() or int(degree) % 2 == 0:
            raise CalcError("an even root of a negative number is not a real number")
        return -_root(-number, degree)
    result = float(number) ** (1.0 / float(degree))
    nearest = round(result)
    # Exact integer roots (root(27, 3) = 3, not 3.0000000000000004).
    if nearest**degree == number:
        return int(nearest)
    return result


def _factorial(n: Any) -> int:
    n = _int(n, "factorial argument")
    if n < 0:
        raise CalcError("factorial is only defined for non-negative integers")
    if n > MAX_FACTORIAL:
        raise CalcError(f"factorial argument must be at most {MAX_FACTORIAL}")
    return math.factorial(n)


def _checked_factor_input(n: Any, name: str) -> int:
    n = _int(n, f"{name} argument")
    if n < 1:
        raise CalcError(f"{name} needs a positive integer")
    if n > MAX_FACTOR_INPUT:
        raise CalcError(f"{name} supports integers up to {MAX_FACTOR_INPUT}")
    return n


def _factors(n: Any) -> list[int]:
    n = _checked_factor_input(n, "factor")
    small, large = [], []
    i = 1
    while i * i <= n:
        if n % i == 0:
            small.append(i)
            if i != n // i:
                large.append(n // i)
        i += 1
    return small + large[::-1]


def _prime_factors(n: Any) -> list[int]:
    n = _checked_factor_input(n, "primeFactor")
    out, p = [], 2
    while p * p <= n:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1 if p == 2 else 2
    if n > 1:
        out.append(n)
    return out


def _gcd(*args: Any) -> int:
    if len(args) < 2:
        raise CalcError("gcd needs at least two integers")
    return math.gcd(*(_int(a, "gcd argument") for a in args))


def _lcm(*args: Any) -> int:
    if len(args) < 2:
        raise CalcError("lcm needs at least two integers")
    return _check_size(math.lcm(*(_int(a, "lcm argument") for a in args)))


def _log(number: Any, base: Any = math.e) -> float:
    number, base = _num(number, "number"), _num(base, "base")
    if number <= 0:
        raise CalcError("log is only defined for positive numbers")
    if base <= 0 or base == 1:
        raise CalcError("the log base must be positive and different from 1")
    return math.log(number, base)


def _variadic(name: str, fn: Callable[[list[Number]], Number], minimum: int = 1) -> Callable[..., Number]:
    def call(*args: Any) -> Number:
        if len(args) < minimum:
            raise CalcError(f"{name} needs at least {minimum} argument{'s' if minimum > 1 else ''}")
        return fn([_num(a, f"{name} argument") for a in args])

    return call


def _fixed(name: str, arity: int, fn: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any) -> Any:
        if len(args) != arity:
            raise CalcError(f"{name} takes {arity} argument{'s' if arity > 1 else ''}, got {len(args)}")
        return fn(*args)

    return call


def _subtract(a: Any, b: Any) -> Number:
    return _num(a, "subtract argument") - _num(b, "subtract argument")


def _modulus(a: Any, b: Any) -> Number:
    a, b = _num(a, "modulus argument"), _num(b, "modulus argument")
    if b == 0:
        raise CalcError("modulus by zero")
    return a % b


def _is_divisible(a: Any, b: Any) -> bool:
    return _modulus(a, b) == 0


def _decimal_to_fraction(x: Any) -> str:
    frac = Fraction(str(_num(x, "decimal"))).limit_denominator(10**6)
    return str(frac.numerator) if frac.denominator == 1 else f"{frac.numerator}/{frac.denominator}"


def _fraction_to_decimal(x: Any) -> float:
    if isinstance(x, str):
        try:
            frac = Fraction(x.strip())
        except (ValueError, ZeroDivisionError):
            raise CalcError(f"cannot read {x!r} as a fraction like '3/4'") from None
        return float(frac)
    return float(_num(x, "fraction"))


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "add": _variadic("add", lambda xs: sum(xs)),
    "subtract": _fixed("subtract", 2, _subtract),
    "multiply": _variadic("multiply", lambda xs: math.prod(xs)),
    "divide": _fixed("divide", 2, _divide),
    "avg": _variadic("avg", lambda xs: _divide(sum(xs), len(xs))),
    "modulus": _fixed("modulus", 2, _modulus),
    "isDivisible": _fixed("isDivisible", 2, _is_divisible),
    "power": _fixed("power", 2, _power),
    "root": lambda *a: _root(*a) if 1 <= len(a) <= 2 else _raise("root takes 1 or 2 arguments"),
    "factorial": _fixed("factorial", 1, _factorial),
    "gcd": _gcd,
    "lcm": _lcm,
    "factor": _fixed("factor", 1, _factors),
    "primeFactor": _fixed("primeFactor", 1, _prime_factors),
    "log": lambda *a: _log(*a) if 1 <= len(a) <= 2 else _raise("log takes 1 or 2 arguments"),
    "percentOf": _fixed("percentOf", 2, lambda v, p: _num(v, "value") * _num(p, "percent") / 100),
    "percentDiscount": _fixed(
        "percentDiscount", 2, lambda v, p: _num(v, "value") * (1 - _num(p, "percent") / 100)
    ),
    "toPercent": _fixed("toPercent", 1, lambda d: _num(d, "decimal") * 100),
    "fromPercent": _fixed("fromPercent", 1, lambda p: _num(p, "percent") / 100),
    "decimalToFraction": _fixed("decimalToFraction", 1, _decimal_to_fraction),
    "fractionToDecimal": _fixed("fractionToDecimal", 1, _fraction_to_decimal),
    # Common extras (the paper's list is "available functions include").
    "sqrt": _fixed("sqrt", 1, lambda x: _root(x, 2)),
    "abs": _fixed("abs", 1, lambda x: abs(_num(x, "abs argument"))),
    "round": lambda *a: _round(*a),
    "floor": _fixed("floor", 1, lambda x: math.floor(_num(x, "floor argument"))),
    "ceil": _fixed("ceil", 1, lambda x: math.ceil(_num(x, "ceil argument"))),
    "min": _variadic("min", min),
    "max": _variadic("max", max),
}
# random(min, max) is handled in the evaluator: it needs the per-call seed.
FUNCTION_NAMES = sorted([*FUNCTIONS, "random"])

CONSTANTS: dict[str, float] = {"pi": math.pi, "e": math.e, "phi": (1 + math.sqrt(5)) / 2, "tau": math.tau}


def _raise(message: str) -> Any:
    raise CalcError(message)


def _round(*args: Any) -> Number:
    if not 1 <= len(args) <= 2:
        raise CalcError("round takes 1 or 2 arguments")
    digits = _int(args[1], "round digits") if len(args) == 2 else 0
    value = round(_num(args[0], "round argument"), digits)
    return int(value) if digits <= 0 else value


_BINOPS: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: lambda a, b: _num(a, "operand") + _num(b, "operand"),
    ast.Sub: lambda a, b: _num(a, "operand") - _num(b, "operand"),
    ast.Mult: lambda a, b: _num(a, "operand") * _num(b, "operand"),
    ast.Div: _divide,
    ast.FloorDiv: lambda a, b: math.floor(_divide(a, b)),
    ast.Pow: _power,
}


class _Evaluator:
    def __init__(self, expression: str, seed: int):
        self.expression = expression
        self.seed = seed
        self.random_calls = 0

    def eval(self, node: ast.AST) -> Any:
        if isinstance(node, ast.Expression):
            return self.eval(node.body)
        if isinstance(node, ast.Constant):
            if isinstance(node.value, bool) or not isinstance(node.value, int | float | str):
                raise CalcError(f"unsupported constant {node.value!r}")
            return node.value
        if isinstance(node, ast.Name):
            if node.id in CONSTANTS:
                return CONSTANTS[node.id]
            if node.id in FUNCTIONS or node.id == "random":
                raise CalcError(f"{node.id} is a function; call it like {node.id}(...)")
            raise CalcError(f"unknown name {node.id!r}; constants are {', '.join(CONSTANTS)}")
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
            value = _num(self.eval(node.operand), "operand")
            return -value if isinstance(node.op, ast.USub) else value
        if isinstance(node, ast.BinOp):
            op = _BINOPS.get(type(node.op))
            if op is None:
                hint = " (use power(base, exponent) or **)" if isinstance(node.op, ast.BitXor) else ""
                raise CalcError(f"unsupported operator {type(node.op).__name__}{hint}")
            return _check_size(op(self.eval(node.left), self.eval(node.right)))
        if isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Name):
                raise CalcError("only the listed functions can be called, by name")
            if node.keywords:
                raise CalcError(f"{node.func.id} takes positional arguments only")
            name = node.func.id
            if name not in FUNCTION_NAMES:
                raise CalcError(f"unknown function {name!r}; available: {', '.join(FUNCTION_NAMES)}")
            args = [self.eval(a) for a in node.args]
            for a in args:
                if isinstance(a, str) and name != "fractionToDecimal":
                    raise CalcError(f"{name} does not take text arguments ({a!r}); use raw numbers")
            if name == "random":
                return self._random(*args)
            fn = FUNCTIONS[name]
            try:
                return _check_size(fn(*args))
            except (OverflowError, ZeroDivisionError) as exc:
                raise CalcError(f"{name}: {exc}") from None
        raise CalcError(f"unsupported syntax: {type(node).__name__}")

    def _random(self, *args: Any) -> Number:
        if len(args) != 2:
            raise CalcError(f"random takes 2 arguments (min, max), got {len(args)}")
        lo, hi = _num(args[0], "min"), _num(args[1], "max")
        if lo > hi:
            raise CalcError("random needs min <= max")
        # Deterministic: seeded by the expression, the call's seed and the occurrence, so a replayed rollout sees
        # the same "random" number.
        self.random_calls += 1
        key = f"{self.seed}|{self.expression}|{self.random_calls}".encode()
        rng = random.Random(int.from_bytes(hashlib.sha256(key).digest()[:8], "big"))
        if isinstance(lo, int) and isinstance(hi, int):
            return rng.randint(lo, hi)
        return rng.uniform(lo, hi)


def evaluate(expression: str, *, seed: int = 0) -> Any:
    """Evaluate a math_calculation expression; raises CalcError with a message for the model."""
    if not expression.strip():
        raise CalcError("the expression is empty")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalcError(f"the expression is longer than {MAX_EXPRESSION_CHARS} characters")
    if any(sym in expression for sym in ("$", "€", "£", "%")):
        raise CalcError(
            "use only raw numbers in expressions (no currency symbols, units or % signs; "
            "use percentOf / modulus instead of %)"
        )
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise CalcError(f"cannot parse the expression: {exc.msg}") from None
    if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
        raise CalcError(f"the expression is too complex (more than {MAX_NODES} syntax nodes)")
    try:
        result = _Evaluator(expression, seed).eval(tree)
    except RecursionError:
        raise CalcError("the expression is nested too deeply") from None
    if isinstance(result, str) and tree.body.__class__ is ast.Constant:
        raise CalcError("the expression is text, not a calculation")
    return result


def render(value: Any) -> Any:
    """JSON-ready result: integral floats become ints, float noise is rounded to 12 significant digits."""
    if isinstance(value, bool | str):
        return value
    if isinstance(value, list):
        return [render(v) for v in value]
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e15:
            return int(value)
        return float(f"{value:.12g}")
    return value
