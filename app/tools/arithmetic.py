"""Exact arithmetic: an expression over integers, fractions and decimals, evaluated as rationals.

The expression is parsed with Python's `ast` (parsing only: nothing is ever executed) and walked node by node;
only number literals, + - * / // % **, unary signs and parentheses are allowed. Every literal is read from its
source text as a Fraction, so 0.1 + 0.2 is exactly 3/10 (a float would give 0.30000000000000004). Sizes are
bounded: a number may hold MAX_BITS bits, so `9 ** 9 ** 9` is refused before any work instead of hanging the
worker, and exponents must be whole numbers (a root is not exact).

    evaluate("0.1 + 0.2")      -> Fraction(3, 10)
    calculate("1 / 3")         -> "1/3 (≈ 0.33333333333333333333)"
"""

from __future__ import annotations

import ast
from fractions import Fraction

MAX_EXPRESSION_CHARS = 2000
MAX_BITS = 4000  # about 1200 decimal digits: far past any sum a chat needs, and quick to print
APPROX_DIGITS = 20  # significant digits of the decimal shown beside a fraction that has no exact one


class ArithmeticProblem(ValueError):
    """An expression that cannot be evaluated exactly here; the message says why and what to do."""


def calculate(expression: str) -> str:
    """The value of `expression` as text: an integer, an exact decimal, or a fraction with its approximation.
    Raises ArithmeticProblem for what cannot be evaluated (a syntax error, division by zero, too large)."""
    return show(evaluate(expression))


def evaluate(expression: str) -> Fraction:
    """The exact value of `expression` (see the module docstring); raises ArithmeticProblem."""
    if not isinstance(expression, str) or not expression.strip():
        raise ArithmeticProblem("The expression is empty. Give numbers and operators, for example 2 * (3 + 4).")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ArithmeticProblem(f"The expression is longer than {MAX_EXPRESSION_CHARS} characters; split it up.")
    text = expression.strip().replace("^", "**").replace("×", "*").replace("÷", "/")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as e:
        raise ArithmeticProblem(
            f"Not a valid expression ({e.msg}): use numbers, + - * / // % ** and parentheses."
        ) from None
    except (RecursionError, MemoryError):
        raise ArithmeticProblem("The expression is nested too deeply; split it up.") from None
    try:
        return _Walker(text).value(tree.body)
    except RecursionError:
        raise ArithmeticProblem("The expression is nested too deeply; split it up.") from None


def show(value: Fraction) -> str:
    """`value` as text: exact whenever a decimal can be (1/4 -> 0.25), else p/q and an approximation."""
    if value.denominator == 1:
        return str(value.numerator)
    exact = _exact_decimal(value)
    if exact is not None:
        return exact
    return f"{value.numerator}/{value.denominator} (≈ {_approximate(value)})"


class _Walker:
    def __init__(self, source: str):
        self._source = source

    def value(self, node: ast.AST) -> Fraction:
        if isinstance(node, ast.Constant):
            return self._literal(node)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
            operand = self.value(node.operand)
            return operand if isinstance(node.op, ast.UAdd) else -operand
        if isinstance(node, ast.BinOp):
            left, right = self.value(node.left), self.value(node.right)
            return _checked(_apply(node.op, left, right))
        raise ArithmeticProblem(
            f"'{ast.get_source_segment(self._source, node) or type(node).__name__}' is not arithmetic: only "
            "numbers, + - * / // % ** and parentheses are allowed."
        )

    def _literal(self, node: ast.Constant) -> Fraction:
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            raise ArithmeticProblem(f"{node.value!r} is not a number.")
        text = ast.get_source_segment(self._source, node) or repr(node.value)
        try:
            return _checked(Fraction(text.replace("_", "")))
        except (ValueError, ZeroDivisionError):  # hexadecimal and the like, or digits past Python's limit
            if isinstance(node.value, int):
                return _checked(Fraction(node.value))
            raise ArithmeticProblem(f"{text} is not a number this calculator reads exactly.") from None


def _apply(op: ast.operator, left: Fraction, right: Fraction) -> Fraction:
    if isinstance(op, ast.Add):
        return left + right
    if isinstance(op, ast.Sub):
        return left - right
    if isinstance(op, ast.Mult):
        return left * right
    if isinstance(op, (ast.Div, ast.FloorDiv, ast.Mod)):
        if right == 0:
            raise ArithmeticProblem("Division by zero: the divisor is 0, so the result is undefined.")
        if isinstance(op, ast.Div):
            return left / right
        return Fraction(left // right) if isinstance(op, ast.FloorDiv) else left % right
    if isinstance(op, ast.Pow):
        return _power(left, right)
    raise ArithmeticProblem(f"The operator {type(op).__name__} is not supported: use + - * / // % **.")


def _power(base: Fraction, exponent: Fraction) -> Fraction:
    if exponent.denominator != 1:
        raise ArithmeticProblem(
            f"The exponent {show(exponent)} is not a whole number: roots are not exact, so they are not computed."
        )
    n = abs(exponent.numerator)
    if base == 0 and exponent < 0:
        raise ArithmeticProblem("Division by zero: 0 to a negative power is undefined.")
    if n > 1 and abs(base) not in (0, 1):
        # the result's size, known before computing it: bits(base) * n
        bits = max(abs(base.numerator).bit_length(), base.denominator.bit_length()) - 1
        if max(bits, 1) * n > MAX_BITS:
            raise ArithmeticProblem(
                f"The result of this power has more than {MAX_BITS} bits (about {MAX_BITS * 3 // 10} digits); "
                "use a smaller exponent."
            )
    return base**exponent.numerator


def _checked(value: Fraction) -> Fraction:
    if max(abs(value.numerator).bit_length(), value.denominator.bit_length()) > MAX_BITS:
        raise ArithmeticProblem(
            f"A number in this calculation has more than {MAX_BITS} bits (about {MAX_BITS * 3 // 10} digits); "
            "use smaller numbers."
        )
    return value


def _exact_decimal(value: Fraction) -> str | None:
    """`value` as a finite decimal, or None when its denominator has a factor other than 2 and 5."""
    d, twos, fives = value.denominator, 0, 0
    while d % 2 == 0:
        d, twos = d // 2, twos + 1
    while d % 5 == 0:
        d, fives = d // 5, fives + 1
    if d != 1:
        return None
    places = max(twos, fives)
    scaled = abs(value.numerator) * 10**places // value.denominator
    digits = str(scaled).rjust(places + 1, "0")
    sign = "-" if value < 0 else ""
    return f"{sign}{digits[:-places]}.{digits[-places:]}"


def _approximate(value: Fraction) -> str:
    """`value` to APPROX_DIGITS significant digits, in plain or scientific notation."""
    from decimal import Context

    context = Context(prec=APPROX_DIGITS)
    return str(context.divide(context.create_decimal(value.numerator), context.create_decimal(value.denominator)))
