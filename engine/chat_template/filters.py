"""Jinja's filters as a chat template gets them: those that could build past the limits are bounded beforehand
(BOUNDED_FILTERS), and every filter call is a step of work whose result is checked (`checked_filter`)."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable
from pprint import pformat
from typing import Any

from jinja2 import filters as jinja_filters
from jinja2.exceptions import SecurityError
from jinja2.filters import make_attrgetter
from jinja2.utils import pass_environment, pass_eval_context

from engine.chat_template.formatting import check_percent
from engine.chat_template.limits import (
    MAX_ITEMS,
    MAX_JSON_INDENT,
    MAX_VALUE_CHARS,
    check_count,
    check_result,
    check_width,
    is_int,
    join_within,
    text_size,
    tick,
    too_large,
)
from engine.chat_template.methods import check_replace


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | str | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's own tojson HTML-escapes <, >, & and ' and sorts keys; prompts need the plain json.dumps text, with
    # non-ASCII kept, exactly as transformers renders it. Encoded piece by piece so that a value whose parts are
    # shared many times (or nest deep under a wide indent) stops at the size limit instead of filling memory.
    step = len(indent) if isinstance(indent, str) else indent
    if is_int(step) and step > MAX_JSON_INDENT:
        raise too_large(f"JSON indented by {step} (at most {MAX_JSON_INDENT})")
    encoder = json.JSONEncoder(ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    return join_within(encoder.iterencode(value), MAX_VALUE_CHARS, lambda: too_large("JSON of more than that"))


def _center(value: Any, width: int = 80) -> str:
    if is_int(width):
        check_width(width - len(str(value)), "center() padding")
    return jinja_filters.do_center(value, width)


def _indent(s: Any, width: int | str = 4, first: bool = False, blank: bool = False) -> str:
    step = len(width) if isinstance(width, str) else width
    check_width(step, "an indent")
    if isinstance(s, str) and is_int(step) and step > 0:
        if len(s) + (len(s.splitlines()) + 1) * step > MAX_VALUE_CHARS:
            raise too_large(f"text indented by {step} on each of its lines")
    return jinja_filters.do_indent(s, width, first, blank)


def _format(value: Any, *args: Any, **kwargs: Any) -> str:
    check_percent(str(value), kwargs or args)
    return jinja_filters.do_format(value, *args, **kwargs)


@pass_eval_context
def _join(eval_ctx: Any, value: Iterable[Any], d: str = "", attribute: str | int | None = None) -> str:
    if attribute is not None:
        value = map(make_attrgetter(eval_ctx.environment, attribute), value)
    items = list(value)
    total = len(str(d)) * max(len(items) - 1, 0)
    for item in items:
        total += len(item) if isinstance(item, str) else text_size(item)
        if total > MAX_VALUE_CHARS:
            raise too_large("a joined string of more than that")
    return jinja_filters.sync_do_join(eval_ctx, items, d)


@pass_eval_context
def _replace(eval_ctx: Any, s: Any, old: Any, new: Any, count: int | None = None) -> str:
    check_replace(str(s), str(old), str(new), count)
    return jinja_filters.do_replace(eval_ctx, s, old, new, count)


@pass_environment
def _wordwrap(environment: Any, s: str, width: int = 79, *args: Any, **kwargs: Any) -> str:
    wrapstring = kwargs.get("wrapstring", args[1] if len(args) > 1 else None) or environment.newline_sequence
    if isinstance(s, str) and is_int(width) and width > 0:
        lines = 2 * len(s) // width + s.count("\n") + 1  # a line is at least half full, or ends a paragraph
        if len(s) + lines * len(str(wrapstring)) > MAX_VALUE_CHARS:
            raise too_large("a wrapped string of more than that")
    return jinja_filters.do_wordwrap(environment, s, width, *args, **kwargs)


def _batch(value: Any, linecount: int, fill_with: Any = None) -> Any:
    if fill_with is not None:
        check_count(linecount, "batch() filled to its line count")
    return jinja_filters.do_batch(value, linecount, fill_with)


def _slice(value: Any, slices: int, fill_with: Any = None) -> Any:
    check_count(slices, "slice() into that many slices")
    return jinja_filters.sync_do_slice(value, slices, fill_with)


@pass_environment
def _sum(environment: Any, iterable: Any, attribute: Any = None, start: Any = 0) -> Any:
    # sum() of lists copies the running total at every step: quadratic, and of no use in a prompt.
    if isinstance(start, bool) or not isinstance(start, (int, float)):
        raise SecurityError("a chat template's sum() adds numbers only (start must be a number)")
    return jinja_filters.sync_do_sum(environment, iterable, attribute, start)


def _round(value: float, precision: int = 0, method: str = "common") -> float:
    if is_int(precision):
        check_width(abs(precision), "a rounding precision")
    return jinja_filters.do_round(value, precision, method)


def _pprint(value: Any) -> str:
    if text_size(value, MAX_ITEMS) > MAX_ITEMS:  # pprint walks the value in Python: keep it small
        raise too_large(f"a pprint of more than {MAX_ITEMS} characters")
    return pformat(value)


# Filters that could build more than the limits before their result could be checked, bounded beforehand.
BOUNDED_FILTERS: dict[str, Callable[..., Any]] = {
    "tojson": _tojson,
    "center": _center,
    "indent": _indent,
    "format": _format,
    "join": _join,
    "replace": _replace,
    "wordwrap": _wordwrap,
    "batch": _batch,
    "slice": _slice,
    "sum": _sum,
    "round": _round,
    "pprint": _pprint,
}


def checked_filter(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    """`func` as a filter whose call is a step of work and whose result is bounded (see check_result)."""

    # functools.wraps also copies jinja's pass_context / pass_environment marker.
    @functools.wraps(func)
    def checked(*args: Any, **kwargs: Any) -> Any:
        tick()
        return check_result(func(*args, **kwargs), f"the result of the {name} filter")

    return checked
