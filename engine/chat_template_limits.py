"""What one chat template render may cost, and the checks engine/chat_template.py's sandbox runs to hold it there.

A chat template is Jinja code shipped with a model: it could loop without end or build gigabytes. So a render is
bounded in:

- Time (RENDER_SECONDS). Every loop step, call, operator, attribute lookup and filter callback of the template
  checks the render's deadline (`tick`), so a runaway render (nested loops, a macro that calls itself twice)
  stops within the deadline plus one step.
- Memory. No single step may build a value that would take more than MAX_VALUE_CHARS written out: string and
  list repetition, `+` and `~`, join, replace, format widths and precisions (str.format, format_map, `%`, the
  format filter), padding (center, ljust, rjust, zfill, indent), the JSON indent, range() and integers. Every
  output buffer stops at MAX_OUTPUT_CHARS, and all the text one render builds, kept or not, at MAX_BUILT_CHARS
  (so a loop cannot pile pieces up in a `{% set %}` block or a macro's buffer). With every value bounded, each
  single step (a join, a sort, a comparison) is bounded in time too, which is what makes a deadline checked
  between steps enough.

Why count work inside the sandbox rather than render in a subprocess that can be killed: a render happens every
turn and every time the context meter counts, takes about a millisecond, and runs in the app, the CLI, the server
and scripts alike. A worker process would add its start-up (importing jinja2, ~0.2 s) and a round trip to each of
them, a process to watch and restart, and an entry point in the frozen bundle. Python threads cannot be killed,
so the check has to run inside the template's own execution: jinja compiles a template to Python, and every
place that code does work goes through the sandbox's hooks (call, getattr, getitem, binary operators, filters,
finalize, concat) or through what engine/chat_template.py's rewrite of the parsed template adds (each `for`
loop's iterable, each list/dict literal, each `~`). What no hook sees is the inside of one C-level operation,
which the size limits keep small.
"""

from __future__ import annotations

import functools
import json
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pprint import pformat
from typing import Any

from jinja2 import TemplateError
from jinja2 import filters as jinja_filters
from jinja2.exceptions import SecurityError
from jinja2.filters import make_attrgetter
from jinja2.sandbox import SandboxedEscapeFormatter, SandboxedFormatter
from jinja2.utils import pass_environment, pass_eval_context

RENDER_SECONDS = 2.0
MAX_OUTPUT_CHARS = 4 * 1024 * 1024  # "4 MB" in messages: a prompt is text, one character is about a byte
MAX_VALUE_CHARS = MAX_OUTPUT_CHARS  # no value built inside a template needs to be larger than its output
MAX_BUILT_CHARS = 16 * MAX_OUTPUT_CHARS  # all text one render builds (templates copy each message a few times)
MAX_FORMAT_WIDTH = 10_000  # a width, precision or padding; real templates pad by a few characters at most
MAX_JSON_INDENT = 64  # tojson's indent is repeated once per nesting level on every line
MAX_ITEMS = 100_000  # range() items, batch() and slice() counts (jinja's own sandbox bounds range() so)
MAX_INT_BITS = 1 << 16  # integers past ~20,000 digits make `*`, `//` and `%` slow
MAX_SOURCE_CHARS = 1024 * 1024  # the largest real templates (tool-calling ones) are ~20 KB
_MB = MAX_OUTPUT_CHARS // (1024 * 1024)
_BUILT_MB = MAX_BUILT_CHARS // (1024 * 1024)
_FIX = "Use another model, or fix its chat template."


class TemplateLimitError(TemplateError):
    """A render went past one of the limits above; the message names the limit."""


# --- the render's deadline and its running total --------------------------------------------------------

_state = threading.local()  # .deadline, .seconds and .built of the render running on this thread, if any


@contextmanager
def render_limits(seconds: float = RENDER_SECONDS) -> Iterator[None]:
    """Renders on this thread inside the block stop with TemplateLimitError after `seconds`, or once they have
    built MAX_BUILT_CHARS of text. Outside such a block only the per-step size limits apply."""
    previous = getattr(_state, "deadline", None), getattr(_state, "seconds", None), getattr(_state, "built", None)
    _state.deadline, _state.seconds, _state.built = time.monotonic() + seconds, seconds, 0
    try:
        yield
    finally:
        _state.deadline, _state.seconds, _state.built = previous


def tick() -> None:
    """One step of template work: raise once the render's deadline has passed."""
    deadline = getattr(_state, "deadline", None)
    if deadline is not None and time.monotonic() > deadline:
        raise TemplateLimitError(
            f"The chat template ran past {_state.seconds:g} s and was stopped (it may loop without end). {_FIX}"
        )


def spend(num_chars: int) -> None:
    """Count new text (or new container slots) the render built."""
    built = getattr(_state, "built", None)
    if built is not None:
        _state.built = built = built + num_chars
        if built > MAX_BUILT_CHARS:
            raise TemplateLimitError(
                f"The chat template built more than {_BUILT_MB} MB of text while rendering and was stopped. {_FIX}"
            )


# --- sizes ------------------------------------------------------------------------------------------------

_DICT_VIEWS = (type({}.keys()), type({}.values()), type({}.items()))
_SEQUENCES = (list, tuple, *_DICT_VIEWS)  # tuples include groupby's named tuples


def text_size(value: Any, limit: int = MAX_VALUE_CHARS) -> int:
    """About how many characters `value` takes written out (str() of it), each shared item counted every time it
    appears, as printing or comparing the value would visit it. Stops counting past `limit` (returns more).

    A container's size is its own brackets and separators plus its items' sizes, computed once per container:
    `[a, a]` nested 60 deep costs 60 steps here, not 2**60.
    """
    if type(value) is str:
        return len(value)
    if not _is_container(value):
        return _own_size(value)
    sizes: dict[int, int] = {}  # id -> size of each container of `value`, done
    stack, steps = [value], 0
    while stack:
        item = stack[-1]
        if id(item) in sizes:
            stack.pop()
            continue
        own = _own_size(item)
        if own > limit:
            sizes[id(item)] = limit + 1
            continue
        parts = _parts(item)
        leaves = _leaves_size(parts)
        if leaves is not None:
            stack.pop()
            sizes[id(item)] = min(own + leaves, limit + 1)
            continue
        waiting = [part for part in parts if _is_container(part) and id(part) not in sizes]
        if waiting:  # size the items first; this container comes back to the top after them
            stack.extend(waiting)
            continue
        stack.pop()
        total = own
        for part in parts:
            total += sizes[id(part)] if _is_container(part) else _own_size(part)
            if total > limit:
                total = limit + 1
                break
        sizes[id(item)] = total
        steps += 1
        if not steps & 1023:
            tick()
    return sizes[id(value)]


def _is_container(item: Any) -> bool:
    kind = type(item)
    if kind is str or kind is int or kind is float or kind is bool or item is None:
        return False
    return kind is list or kind is tuple or kind is dict or isinstance(item, (*_SEQUENCES, Mapping))


def _leaves_size(parts: Iterable[Any]) -> int | None:
    """The size of `parts` when they are all strings or all integers, counted at C speed; None otherwise."""
    kinds = set(map(type, parts))
    if kinds <= {str}:
        return sum(map(len, parts))
    if kinds <= {int, bool}:
        return sum(map(int.bit_length, parts)) // 3 + len(parts)
    return None


def _parts(item: Any) -> Iterable[Any]:
    return (*item.keys(), *item.values()) if isinstance(item, Mapping) else item


def _own_size(item: Any) -> int:
    """Characters `item` takes itself: a leaf's text, a container's brackets and separators."""
    if isinstance(item, str):
        return len(item)
    if type(item) is int:
        return item.bit_length() // 3 + 1  # a decimal digit holds log2(10) > 3 bits
    if isinstance(item, _SEQUENCES):
        return 2 + 2 * len(item)
    if isinstance(item, Mapping):
        return 2 + 4 * len(item)
    return 8  # floats, None, booleans; objects whose text does not show their contents (namespaces, loops)


def too_large(what: str) -> TemplateLimitError:
    return TemplateLimitError(
        f"The chat template tried to build {what}; that is too large for a chat template (at most {_MB} MB of "
        f"text). {_FIX}"
    )


def check_size(value: Any, what: str) -> Any:
    """`value`, after checking it would take at most MAX_VALUE_CHARS written out."""
    if text_size(value) > MAX_VALUE_CHARS:
        raise too_large(what)
    return value


def check_int(value: int, what: str) -> int:
    if value.bit_length() > MAX_INT_BITS:
        raise too_large(f"{what}, an integer of {value.bit_length()} bits")
    return value


def check_width(value: Any, what: str) -> None:
    """Refuse a width, precision, padding or tab size past MAX_FORMAT_WIDTH."""
    if is_int(value) and value > MAX_FORMAT_WIDTH:
        raise TemplateLimitError(
            f"The chat template asked for {what} of {value}; that is too large for a chat template (at most "
            f"{MAX_FORMAT_WIDTH}). {_FIX}"
        )


def check_count(count: Any, what: str) -> None:
    """Refuse a number of items past MAX_ITEMS."""
    if is_int(count) and count > MAX_ITEMS:
        raise TemplateLimitError(
            f"The chat template asked for {what}, {count} items; that is too large for a chat template (at most "
            f"{MAX_ITEMS}). {_FIX}"
        )


def check_result(value: Any, what: str) -> Any:
    """`value` (what a call, operator or filter produced), after bounding it and counting it as built."""
    if isinstance(value, str):
        if len(value) > MAX_VALUE_CHARS:
            raise too_large(f"{what} of {len(value)} characters")
        spend(len(value))
    elif type(value) is int:
        check_int(value, what)
    elif isinstance(value, (list, tuple, Mapping)):
        check_size(value, what)
        spend(len(value))  # a new container holds references: only its slots are new memory
    return value


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_spec_numbers(spec: str, what: str) -> None:
    # Every run of digits in a format spec is a fill, a width or a precision; none may pass the width limit.
    for digits in re.findall(r"\d+", spec):
        check_width(int(digits) if len(digits) <= 6 else MAX_FORMAT_WIDTH + 1, what)


def _join_within(pieces: Iterable[str], limit: int, error: Callable[[], TemplateLimitError]) -> str:
    parts, total = [], 0
    for piece in pieces:
        total += len(piece)
        if total > limit:
            raise error()
        parts.append(piece)
        if not len(parts) & 1023:
            tick()
    return "".join(parts)


def bounded_concat(pieces: Iterable[str]) -> str:
    """environment.concat: jinja joins every output buffer (the template's, each macro's, {% set %} blocks)
    with it."""
    return _join_within(pieces, MAX_OUTPUT_CHARS, _output_too_large)


def _output_too_large() -> TemplateLimitError:
    return TemplateLimitError(f"The chat template rendered more than {_MB} MB of text and was stopped. {_FIX}")


def text_of(value: Any) -> str:
    """str(value), bounded."""
    if not isinstance(value, str) and text_size(value) > MAX_VALUE_CHARS:
        raise too_large("the text of a value of more than that")
    return str(value)


def finalize(value: Any) -> str:
    """environment.finalize: every {{ expression }} goes through here, so its text counts as built wherever it
    is buffered."""
    text = value if type(value) is str else text_of(value)
    spend(len(text))
    return text


def concat_parts(parts: tuple[Any, ...]) -> str:
    """`a ~ b ~ ...`, bounded."""
    texts = [part if type(part) is str else text_of(part) for part in parts]
    total = sum(map(len, texts))
    if total > MAX_VALUE_CHARS:
        raise too_large("a string joined with ~ of more than that")
    spend(total)
    return "".join(texts)


def loop_steps(iterable: Any) -> Iterator[Any]:
    """The items of a `for` loop, each one a step of work."""
    for item in iterable:
        tick()
        yield item


def bounded_range(*args: int) -> range:
    """The templates' range()."""
    items = range(*args)
    check_count(len(items), f"range({', '.join(map(str, args))})")
    return items


# --- formatting -------------------------------------------------------------------------------------------

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


# --- methods ----------------------------------------------------------------------------------------------

# Methods of plain values a template may call. Any other (str.encode, str.translate, int.to_bytes, ...) is
# refused: an unknown builtin could allocate past the limits before its result could be checked.
_STR_METHODS = frozenset(
    "capitalize casefold count endswith find index isalnum isalpha isascii isdecimal isdigit isidentifier "
    "islower isnumeric isprintable isspace istitle isupper lower lstrip partition removeprefix removesuffix "
    "rfind rindex rpartition rsplit rstrip split splitlines startswith strip swapcase title upper "
    "center ljust rjust zfill expandtabs join replace striptags unescape".split()
)
_METHODS: dict[type, frozenset[str]] = {
    dict: frozenset({"get", "items", "keys", "values", "copy", "fromkeys"}),
    list: frozenset({"index", "count", "copy"}),
    tuple: frozenset({"index", "count"}),
    int: frozenset({"bit_length", "is_integer"}),
    float: frozenset({"is_integer"}),
}
VALUE_TYPES = (str, int, float, list, tuple, dict, type)  # owners of the methods checked here


def checked_method_args(owner: Any, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """The arguments for calling `owner.name(...)` (owner one of VALUE_TYPES), after refusing methods off the
    list and bounding those that build text from their arguments (padding, tab sizes, joins, replacements)."""
    if isinstance(owner, str):
        allowed = name in _STR_METHODS
    elif isinstance(owner, type):  # a classmethod of a value type, e.g. dict.fromkeys
        allowed = name in _METHODS.get(owner, frozenset())
    else:
        allowed = any(isinstance(owner, kind) and name in names for kind, names in _METHODS.items())
    if not allowed:
        raise SecurityError(f"a chat template may not call {type(owner).__name__}.{name}()")
    if not isinstance(owner, str):
        return args
    first = args[0] if args else None
    if name in ("center", "ljust", "rjust", "zfill"):
        width = first if first is not None else kwargs.get("width")
        if is_int(width):
            check_width(width - len(owner), f"str.{name}() padding")
    elif name == "expandtabs":
        size = first if first is not None else kwargs.get("tabsize", 8)
        check_width(size, "a tab size")
        if is_int(size) and len(owner) + owner.count("\t") * size > MAX_VALUE_CHARS:
            raise too_large("a string with its tabs expanded")
    elif name == "join" and args:
        items = list(first)  # a generator is read once, here: the call gets the list
        total = len(owner) * max(len(items) - 1, 0) + sum(len(item) for item in items if isinstance(item, str))
        if total > MAX_VALUE_CHARS:
            raise too_large("a joined string of more than that")
        return (items, *args[1:])
    elif name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
        _check_replace(owner, args[0], args[1], args[2] if len(args) > 2 else kwargs.get("count"))
    return args


def _check_replace(text: str, old: str, new: str, count: Any) -> None:
    if len(new) > len(old):
        hits = text.count(old) if not is_int(count) or count < 0 else min(count, text.count(old))
        if len(text) + hits * (len(new) - len(old)) > MAX_VALUE_CHARS:
            raise too_large(f"a string with {hits} replacements of {len(new)} characters")


# --- filters ----------------------------------------------------------------------------------------------


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
    return _join_within(encoder.iterencode(value), MAX_VALUE_CHARS, lambda: too_large("JSON of more than that"))


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
    _check_replace(str(s), str(old), str(new), count)
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
