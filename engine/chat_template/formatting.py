"""%-format and str.format inside a chat template, bounded before Python builds the text (widths, precisions
and the total a format adds: engine/chat_template/limits.py)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from jinja2.sandbox import SandboxedEscapeFormatter, SandboxedFormatter

from engine.chat_template.limits import (
    MAX_FORMAT_WIDTH,
    MAX_VALUE_CHARS,
    check_width,
    is_int,
    text_size,
    tick,
    too_large,
)


def _check_spec_numbers(spec: str, what: str) -> None:
    # Every run of digits in a format spec is a fill, a width or a precision; none may pass the width limit.
    for digits in re.findall(r"\d+", spec):
        check_width(int(digits) if len(digits) <= 6 else MAX_FORMAT_WIDTH + 1, what)


# One %-conversion: %(key)flags width.precision length type
_PERCENT = re.compile(r"%(?:\(([^)]*)\))?[#0\- +]*(\*|\d+)?(?:\.(\*|\d+)?)?[hlL]?(.?)", re.DOTALL)


def check_percent(fmt: str, args: Any) -> None:
    """Bound `fmt % args` before Python builds it: widths, precisions and the text the values add."""
    positional = list(args) if isinstance(args, tuple) else [args]
    named = args if isinstance(args, Mapping) else None
    total, index = len(fmt), 0
    for key, width, precision, conversion in _PERCENT.findall(fmt):
        if conversion == "%":
            continue
        for number in (width, precision):
            if number == "*":  # the number is the next argument
                value = positional[index] if index < len(positional) else None
                index += 1
                check_width(value, "a %-format width")
                total += value if is_int(value) and value > 0 else 0
            elif number:
                _check_spec_numbers(number, "a %-format width")
                total += int(number)
        if key and named is not None:
            value = named.get(key)
        else:
            value = positional[index] if index < len(positional) else args
            index += 1
        total += text_size(value)
        if total > MAX_VALUE_CHARS:
            raise too_large("a %-formatted string of more than that")


class LimitedFormatter(SandboxedFormatter):
    """The sandbox's str.format / format_map formatter, with bounded widths and a bounded total."""

    def __init__(self, env: Any, **kwargs: Any) -> None:
        super().__init__(env, **kwargs)
        self._total = 0

    def format_field(self, value: Any, format_spec: str) -> Any:
        tick()
        _check_spec_numbers(format_spec, "a format width or precision")
        if text_size(value) > MAX_VALUE_CHARS:
            raise too_large("a formatted value of more than that")
        text = super().format_field(value, format_spec)
        self._total += len(text)
        if self._total > MAX_VALUE_CHARS:
            raise too_large("a formatted string of more than that")
        return text


class LimitedEscapeFormatter(LimitedFormatter, SandboxedEscapeFormatter):
    """LimitedFormatter for Markup.format."""
