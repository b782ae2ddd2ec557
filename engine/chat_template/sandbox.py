"""The jinja environment a chat template runs in: jinja2's immutable sandbox with the globals, filters and settings
Hugging Face templates expect, where every place compiled template code does work is counted and bounded
(limits.py), and the parsed template is rewritten so its loops, literals and `~` are counted too."""

from __future__ import annotations

import functools
import threading
import types
from collections.abc import Callable
from datetime import datetime
from typing import Any, ClassVar

from jinja2 import BaseLoader, TemplateError, TemplateNotFound, nodes
from jinja2.exceptions import SecurityError
from jinja2.ext import Extension, loopcontrols
from jinja2.runtime import LoopContext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace
from jinja2.visitor import NodeTransformer
from markupsafe import Markup

from engine.chat_template.filters import BOUNDED_FILTERS, checked_filter
from engine.chat_template.formatting import LimitedEscapeFormatter, LimitedFormatter, check_percent
from engine.chat_template.limits import (
    MAX_INT_BITS,
    MAX_SOURCE_CHARS,
    MAX_VALUE_CHARS,
    TemplateLimitError,
    bounded_concat,
    bounded_range,
    check_int,
    check_result,
    check_size,
    concat_parts,
    finalize,
    is_int,
    loop_steps,
    spend,
    text_size,
    tick,
    too_large,
)
from engine.chat_template.methods import VALUE_TYPES, checked_method_args


class TemplateRaised(TemplateError):
    """What `raise_exception(message)` throws, told apart from Jinja's own errors."""


def _raise_exception(message: Any) -> None:
    raise TemplateRaised(str(message))


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _SafeNamespace(Namespace):
    """`namespace(...)` that refuses underscore names, which could shadow Namespace's internals, and whose text
    does not show its attributes (so printing one costs nothing, however often its values are shared)."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        # `self` is taken from args, as Namespace does, so a template may still pass `self=...` as a name.
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _SafeNamespace._check(name)
        Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _SafeNamespace._check(name)
        Namespace.__setitem__(self, name, value)

    def __repr__(self) -> str:
        return "<Namespace>"

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise SecurityError(f"a chat template may not set the underscore attribute {name!r} on a namespace")


class _GenerationTag(Extension):
    """`{% generation %}...{% endgeneration %}` marks assistant text for training masks; here it just renders."""

    tags: ClassVar[set[str]] = {"generation"}

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body).set_lineno(lineno)


class _NoFiles(BaseLoader):
    """Refuses every `{% include %}`, `{% import %}` and `{% extends %}`: a template is one self-contained text."""

    def get_source(self, environment: Any, template: str) -> Any:
        raise TemplateNotFound(f"{template!r} (a chat template cannot load other templates or files)")


# Filters the rewrite below puts into templates. Filters are looked up when a template compiles, so a template
# cannot shadow them; calling one by name from a template does nothing it could not do anyway.
_LOOP_FILTER = "tandem_loop_steps"
_LITERAL_FILTER = "tandem_literal"
_CONCAT_FILTER = "tandem_concat"


class _CountWork(NodeTransformer):
    """Rewrites a parsed template so that its work is counted (limits.py): each `for`
    iterates through a filter that ticks per item, list/tuple/dict literals are size-checked (`[a, a]` shares
    one value twice, and nesting that doubles it), and `~` joins within the size limit."""

    def visit_For(self, node: nodes.For) -> nodes.Node:
        self.generic_visit(node)
        node.iter = _filtered(node.iter, _LOOP_FILTER)
        return node

    def visit_List(self, node: nodes.List) -> nodes.Node:
        self.generic_visit(node)
        return _filtered(node, _LITERAL_FILTER)

    def visit_Dict(self, node: nodes.Dict) -> nodes.Node:
        self.generic_visit(node)
        return _filtered(node, _LITERAL_FILTER)

    def visit_Tuple(self, node: nodes.Tuple) -> nodes.Node:
        self.generic_visit(node)
        return _filtered(node, _LITERAL_FILTER) if node.ctx == "load" else node  # not `{% set a, b = ... %}`

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        return _filtered(nodes.Tuple(node.nodes, "load", lineno=node.lineno), _CONCAT_FILTER)


def _filtered(node: nodes.Expr, name: str) -> nodes.Filter:
    return nodes.Filter(node, name, [], [], None, None, lineno=node.lineno)


class _Sandbox(ImmutableSandboxedEnvironment):
    """jinja2's immutable sandbox with every place compiled template code does work counted and bounded."""

    intercepted_binops = frozenset({"+", "-", "*", "/", "//", "%", "**"})

    def __init__(self) -> None:
        super().__init__(
            loader=_NoFiles(),
            trim_blocks=True,
            lstrip_blocks=True,
            extensions=[_GenerationTag, loopcontrols],
            finalize=finalize,
        )
        self.concat = bounded_concat  # type: ignore[method-assign]
        filters = {**self.filters, **BOUNDED_FILTERS}
        self.filters = {name: checked_filter(name, func) for name, func in filters.items()}
        self.filters[_LOOP_FILTER] = loop_steps
        self.filters[_LITERAL_FILTER] = lambda value: check_size(value, "a list or dict of more than that")
        self.filters[_CONCAT_FILTER] = concat_parts
        self.globals.pop("lipsum", None)  # writes any amount of text in a Python loop; no chat template uses it
        self.globals["range"] = bounded_range
        self.globals["raise_exception"] = _raise_exception
        self.globals["strftime_now"] = _strftime_now
        self.globals["namespace"] = _SafeNamespace

    def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
        if len(source) > MAX_SOURCE_CHARS:
            raise TemplateLimitError(
                f"The chat template is {len(source)} characters long; a chat template may have at most "
                f"{MAX_SOURCE_CHARS}. Use another model, or fix its chat template."
            )
        return _CountWork().visit(super()._parse(source, name, filename))

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        tick()
        if operator == "+" and type(left) is str and type(right) is str:  # how most templates build a prompt
            if len(left) + len(right) > MAX_VALUE_CHARS:
                raise too_large("a string joined with + of more than that")
            spend(len(left) + len(right))
            return left + right
        if operator == "**" and is_int(left) and is_int(right) and abs(left) > 1:
            # The result has about right * bits(left) bits; past the bound it would take seconds or hang.
            if right * abs(left).bit_length() > MAX_INT_BITS:
                raise too_large(f"{left} ** {right}")
        elif operator == "*":
            for seq, count in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and is_int(count) and count > 1:
                    if text_size(seq, MAX_VALUE_CHARS // count + 1) * count > MAX_VALUE_CHARS:
                        raise too_large(f"a sequence repeated {count} times")
            if is_int(left) and is_int(right) and left.bit_length() + right.bit_length() > MAX_INT_BITS:
                raise too_large(f"a product of {left.bit_length() + right.bit_length()} bits")
        elif operator == "+" and isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)):
            # len() first: it is a lower bound of the size, and free.
            if len(left) + len(right) > MAX_VALUE_CHARS or text_size(left) + text_size(right) > MAX_VALUE_CHARS:
                raise too_large("a string or list joined with + of more than that")
        elif operator == "%" and isinstance(left, str):
            check_percent(left, right)
        result = self.binop_table[operator](left, right)
        if type(result) is int:
            check_int(result, "a number")
        elif isinstance(result, (str, list, tuple)):
            spend(len(result))
        return result

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 (jinja's names)
        tick()
        if not __self.is_safe_callable(__obj):
            raise SecurityError(f"{__obj!r} is not safely callable")
        if isinstance(__obj, LoopContext) and args:  # `loop(children)` in a recursive loop: its items are steps too
            args = (loop_steps(args[0]), *args[1:])
        owner = getattr(__obj, "__self__", None)
        if isinstance(__obj, (types.BuiltinMethodType, types.MethodType)) and isinstance(owner, VALUE_TYPES):
            args = checked_method_args(owner, __obj.__name__, args, kwargs)
        # Arguments may share one value many times (`f(x, x)`), and a macro's varargs hold them as a tuple.
        if text_size((args, kwargs)) > MAX_VALUE_CHARS:
            raise too_large("call arguments of more than that")
        return check_result(__context.call(__obj, *args, **kwargs), "a call's result")

    def getattr(self, obj: Any, attribute: str) -> Any:
        tick()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        tick()
        return super().getitem(obj, argument)

    def call_filter(self, *args: Any, **kwargs: Any) -> Any:  # map('upper'): once per item
        tick()
        return super().call_filter(*args, **kwargs)

    def call_test(self, *args: Any, **kwargs: Any) -> Any:  # select('odd'): once per item
        tick()
        return super().call_test(*args, **kwargs)

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        # jinja's own, with a formatter that bounds widths and the total (jinja builds its formatter inline).
        if not isinstance(value, (types.MethodType, types.BuiltinMethodType)) or value.__name__ not in (
            "format",
            "format_map",
        ):
            return None
        f_self = value.__self__
        if not isinstance(f_self, str):
            return None
        str_type = type(f_self)
        is_format_map = value.__name__ == "format_map"

        def wrapper(*args: Any, **kwargs: Any) -> str:
            if is_format_map:
                if kwargs:
                    raise TypeError("format_map() takes no keyword arguments")
                if len(args) != 1:
                    raise TypeError(f"format_map() takes exactly one argument ({len(args)} given)")
                kwargs, args = args[0], ()
            if isinstance(f_self, Markup):
                formatter: LimitedFormatter = LimitedEscapeFormatter(self, escape=f_self.escape)
            else:
                formatter = LimitedFormatter(self)
            return str_type(formatter.vformat(f_self, args, kwargs))

        return functools.update_wrapper(wrapper, value)


_ENVIRONMENT: _Sandbox | None = None
_ENVIRONMENT_LOCK = threading.Lock()


def environment() -> _Sandbox:
    # One shared environment: it holds no per-render state, and building it on first use keeps import cheap.
    global _ENVIRONMENT
    with _ENVIRONMENT_LOCK:
        if _ENVIRONMENT is None:
            _ENVIRONMENT = _Sandbox()
        return _ENVIRONMENT
