"""The app's own tools, which need no server: the current date and time, and exact arithmetic.

Each is a ToolSpec (what the model sees) and a plain function of its arguments that returns a ToolOutcome; they
are quick and never block on anything outside the process.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from app.tools.arithmetic import ArithmeticProblem, calculate
from app.tools.spec import ToolOutcome, ToolSpec

CLOCK = ToolSpec(
    "current_datetime",
    "The current local date and time, with the day of the week and the local time zone.",
    {"type": "object", "properties": {}, "additionalProperties": False},
)
CALCULATOR = ToolSpec(
    "calculate",
    "Evaluate an arithmetic expression exactly (integers, fractions and decimals; + - * / // % ** and "
    "parentheses). Use it for any sum whose exact result matters.",
    {
        "type": "object",
        "properties": {"expression": {"type": "string", "description": "for example (1.5 + 2) * 3 / 7"}},
        "required": ["expression"],
        "additionalProperties": False,
    },
)


def current_datetime(arguments: Mapping[str, Any], now: Callable[[], datetime] = datetime.now) -> ToolOutcome:
    """The local date and time as ISO 8601 with its UTC offset, in words, and the zone's name."""
    moment = now().astimezone()  # aware, in the machine's local zone
    offset = moment.strftime("%z")
    zone = moment.tzname() or f"UTC{offset[:3]}:{offset[3:]}"
    return ToolOutcome(f"{moment.isoformat(timespec='seconds')} ({moment.strftime('%A %d %B %Y, %H:%M:%S')}, {zone})")


def arithmetic(arguments: Mapping[str, Any]) -> ToolOutcome:
    expression = arguments.get("expression")
    if not isinstance(expression, str):
        return ToolOutcome('Give the expression as a string: {"expression": "2 * (3 + 4)"}.', is_error=True)
    try:
        return ToolOutcome(f"{expression.strip()} = {calculate(expression)}")
    except ArithmeticProblem as e:
        return ToolOutcome(str(e), is_error=True)


BUILTINS: dict[str, tuple[ToolSpec, Callable[[Mapping[str, Any]], ToolOutcome]]] = {
    CLOCK.name: (CLOCK, current_datetime),
    CALCULATOR.name: (CALCULATOR, arithmetic),
}
