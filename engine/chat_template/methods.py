"""The methods of plain values (str, list, dict, ...) a chat template may call, and the bounds on those that build
text from their arguments (padding, tab sizes, joins, replacements)."""

from __future__ import annotations

from typing import Any

from jinja2.exceptions import SecurityError

from engine.chat_template.limits import MAX_VALUE_CHARS, check_width, is_int, too_large

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
        check_replace(owner, args[0], args[1], args[2] if len(args) > 2 else kwargs.get("count"))
    return args


def check_replace(text: str, old: str, new: str, count: Any) -> None:
    if len(new) > len(old):
        hits = text.count(old) if not is_int(count) or count < 0 else min(count, text.count(old))
        if len(text) + hits * (len(new) - len(old)) > MAX_VALUE_CHARS:
            raise too_large(f"a string with {hits} replacements of {len(new)} characters")
