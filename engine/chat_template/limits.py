"""What one chat template render may cost, and the checks engine/chat_template/sandbox.py runs to hold it there.

A chat template is Jinja code shipped with a model: it could loop without end or build gigabytes. So a render is
bounded in:

- Time (RENDER_SECONDS). Every loop step, call, operator, attribute lookup and filter callback of the template
  checks the render's deadline (`tick`), so a runaway render (nested loops, a macro that calls itself twice)
  stops within the deadline plus one step.
- Memory. No single step may build a value that would take more than MAX_VALUE_CHARS written out: string and
  list repetition, `+` and `~`, join, replace, format widths and precisions (str.format, format_map, `%`, the
  format filter: formatting.py), padding (center, ljust, rjust, zfill, indent: methods.py and filters.py), the
  JSON indent, range() and integers. Every output buffer stops at MAX_OUTPUT_CHARS, and all the text one render
  builds, kept or not, at MAX_BUILT_CHARS (so a loop cannot pile pieces up in a `{% set %}` block or a macro's
  buffer). With every value bounded, each single step (a join, a sort, a comparison) is bounded in time too,
  which is what makes a deadline checked between steps enough.

Why count work inside the sandbox rather than render in a subprocess that can be killed: a render happens every
turn and every time the context meter counts, takes about a millisecond, and runs in the app, the CLI, the server
and scripts alike. A worker process would add its start-up (importing jinja2) and a round trip to each of
them, a process to watch and restart, and an entry point in the frozen bundle. Python threads cannot be killed,
so the check has to run inside the template's own execution: jinja compiles a template to Python, and every
place that code does work goes through the sandbox's hooks (call, getattr, getitem, binary operators, filters,
finalize, concat) or through what sandbox.py's rewrite of the parsed template adds (each `for` loop's iterable,
each list/dict literal, each `~`). What no hook sees is the inside of one C-level operation, which the size
limits keep small.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from jinja2 import TemplateError

RENDER_SECONDS = 2.0
MAX_OUTPUT_CHARS = 4 * 1024 * 1024  # "4 MB" in messages: a prompt is text, one character is about a byte
MAX_VALUE_CHARS = MAX_OUTPUT_CHARS  # no value built inside a template needs to be larger than its output
MAX_BUILT_CHARS = 16 * MAX_OUTPUT_CHARS  # all text one render builds (templates copy each message a few times)
MAX_FORMAT_WIDTH = 10_000  # a width, precision or padding; real templates pad by a few characters at most
MAX_JSON_INDENT = 64  # tojson's indent is repeated once per nesting level on every line
MAX_ITEMS = 100_000  # range() items, batch() and slice() counts (jinja's own sandbox bounds range() so)
MAX_INT_BITS = 1 << 16  # integers past ~20,000 digits make `*`, `//` and `%` slow
MAX_SOURCE_CHARS = 1024 * 1024  # the largest real templates (tool-calling ones) are ~20 KB
# A long render pauses this briefly this often, so that other threads get the GIL: CPython hands it to a waiting
# thread only after its 5 ms switch interval, and a GUI thread whose every SQLite or Qt call releases the GIL
# would wait that long each time, and a send beside a runaway template would stall the window. A usual render
# (about a millisecond) never pauses.
PAUSE_EVERY = 0.002
PAUSE_SECONDS = 0.0002
_MB = MAX_OUTPUT_CHARS // (1024 * 1024)
_BUILT_MB = MAX_BUILT_CHARS // (1024 * 1024)
_FIX = "Use another model, or fix its chat template."


class TemplateLimitError(TemplateError):
    """A render went past one of the limits above; the message names the limit."""


# --- the render's deadline and its running total --------------------------------------------------------

_state = threading.local()  # .deadline, .seconds, .built and .next_pause of this thread's render, if any


@contextmanager
def render_limits(seconds: float = RENDER_SECONDS) -> Iterator[None]:
    """Renders on this thread inside the block stop with TemplateLimitError after `seconds`, or once they have
    built MAX_BUILT_CHARS of text. Outside such a block only the per-step size limits apply."""
    names = ("deadline", "seconds", "built", "next_pause")
    previous = tuple(getattr(_state, name, None) for name in names)
    now = time.monotonic()
    _state.deadline, _state.seconds, _state.built, _state.next_pause = now + seconds, seconds, 0, now + PAUSE_EVERY
    try:
        yield
    finally:
        for name, value in zip(names, previous):
            setattr(_state, name, value)


def tick() -> None:
    """One step of template work: raise once the render's deadline has passed; pause now and then (PAUSE_EVERY)."""
    deadline = getattr(_state, "deadline", None)
    if deadline is None:
        return
    now = time.monotonic()
    if now > deadline:
        raise TemplateLimitError(
            f"The chat template ran past {_state.seconds:g} s and was stopped (it may loop without end). {_FIX}"
        )
    if now > _state.next_pause:
        time.sleep(PAUSE_SECONDS)
        _state.next_pause = time.monotonic() + PAUSE_EVERY


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


def join_within(pieces: Iterable[str], limit: int, error: Callable[[], TemplateLimitError]) -> str:
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
    return join_within(pieces, MAX_OUTPUT_CHARS, _output_too_large)


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
